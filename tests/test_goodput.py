"""attach --find-max-goodput: the search (ladder, then bisection) finds a known edge, the knee of the
throughput curve, the SLO judgement with intervals, the curve in sweep reports, and the command end to end
against a server with a known capacity (tests/servers/faults.py --slots: at most N requests at once)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from diagnose.errors import InputError
from diagnose.runs import goodput as gp
from diagnose.signals.sweep import meets
from tests.cli_inproc import diagnose
from tests.servers.faults import fault_server

DIAG = [sys.executable, "-m", "diagnose"]
SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


def _point(level: float, ok: bool, tps: float, clear: bool = True) -> gp.LevelPoint:
    t = gp.Term(10.0 if ok else 90.0, 50.0, math.nan, math.nan, "meets" if ok else "fails")
    return gp.LevelPoint(level=level, label=f"c={int(level)}", source="", valid=True, requests=100, meets=ok,
                         clear=clear, terms={"ttft_p99": t}, output_tps=tps, output_tps_lo=math.nan,
                         output_tps_hi=math.nan, goodput_rps=1.0, goodput_ratio=1.0)


def _server(edge: float, cap: float) -> tuple[list[float], Any]:
    """A server that meets the SLO up to ``edge`` and whose throughput grows linearly up to ``cap``."""
    tried: list[float] = []

    def measure(level: float, step: str) -> gp.LevelPoint:
        tried.append(level)
        p = _point(level, level <= edge, 100.0 * min(level, cap))
        p.step = step
        return p

    return tried, measure


@pytest.mark.parametrize("edge", [1, 3, 5, 6, 7, 11, 24, 31])
def test_search_finds_the_edge_to_one_step(edge: int) -> None:
    tried, measure = _server(edge, 8)
    r = gp.search(measure, [1, 2, 4, 8, 16, 32, 64], "concurrency", max_bisections=6)
    assert r.max_goodput is not None and r.max_goodput.level == edge
    assert r.first_failing is not None and r.first_failing.level == edge + 1
    assert "bisected to one step" in r.stopped
    rungs = (1, 2, 4, 8, 16, 32, 64)
    first_fail = min(v for v in rungs if v > edge)
    ladder = [v for v in tried if v in rungs]
    beyond = [v for v in ladder if v > first_fail]
    assert ladder == [v for v in rungs if v <= first_fail] + beyond
    # past the first failing rung only while output tok/s still grew (it flattens from c=8), at most
    # PLATEAU_LEVELS rungs (issue 34 item 6): never the rest of the ladder
    assert len(beyond) <= gp.PLATEAU_LEVELS
    assert all(v <= 16 for v in beyond) and (first_fail < 16 or not beyond)
    assert (r.saturation is not None and r.saturation.level == 8) or len(beyond) == gp.PLATEAU_LEVELS
    assert len(tried) == len(set(tried))


def test_search_edges_of_the_ladder_and_the_bisection_budget() -> None:
    tried, measure = _server(100, 8)
    r = gp.search(measure, [1, 2, 4], "concurrency")
    assert r.max_goodput is not None and r.max_goodput.level == 4 and r.first_failing is None
    assert r.edge_note.startswith("at least c=4") and tried == [1, 2, 4]
    tried, measure = _server(0, 8)
    r = gp.search(measure, [2, 4], "concurrency")
    assert r.max_goodput is None and tried == [2] and "already failed" in r.stopped
    tried, measure = _server(37, 8)
    r = gp.search(measure, [1, 64], "concurrency", max_bisections=2)
    assert len(tried) == 4 and "budget (2) spent" in r.stopped
    assert r.max_goodput is not None and r.first_failing is not None
    assert r.max_goodput.level <= 37 < r.first_failing.level


def test_the_search_goes_past_the_edge_to_the_throughput_plateau() -> None:
    """The SLO fails from c=3 while throughput grows up to c=8: the saturation is the plateau (c=8), found by
    going on up the ladder, not the best level before the edge; where the bound stops it first, 'at least'."""
    tried, measure = _server(2, 8)
    r = gp.search(measure, [1, 2, 4, 8, 16, 32, 64], "concurrency")
    assert r.max_goodput is not None and r.max_goodput.level == 2 and r.first_failing is not None
    assert r.first_failing.level == 3
    assert tried == [1, 2, 4, 3, 8, 16] and [p.step for p in r.points][-2:] == ["plateau", "plateau"]
    assert r.saturation is not None and r.saturation.level == 8, r.saturation_note
    assert "2 level(s) past the edge" in r.stopped
    tried, measure = _server(2, 1000)  # still growing at the bound
    r = gp.search(measure, [1, 2, 4, 8, 16, 32, 64], "concurrency")
    assert tried == [1, 2, 4, 3, 8, 16] and r.saturation is None
    assert r.saturation_note.endswith("saturation at least 1600 tok/s"), r.saturation_note
    tried, measure = _server(2, 1000)
    r = gp.search(measure, [1, 2, 4, 8], "concurrency", max_plateau=0)  # the bound off: the old search
    assert tried == [1, 2, 4, 3]


def test_rate_bisection_is_geometric_and_stops_within_ten_percent() -> None:
    tried: list[float] = []

    def measure(level: float, step: str) -> gp.LevelPoint:
        tried.append(level)
        return _point(level, level <= 13.0, level)

    r = gp.search(measure, [2, 4, 8, 16, 32], "rate", max_bisections=10)
    assert r.max_goodput is not None and r.first_failing is not None
    assert r.max_goodput.level <= 13.0 < r.first_failing.level
    assert r.first_failing.level / r.max_goodput.level <= gp.RATE_RESOLUTION
    assert tried[:4] == [2, 4, 8, 16] and tried[4] == pytest.approx(math.sqrt(8 * 16), abs=1e-3)


def test_marginal_levels_make_the_edge_uncertain() -> None:
    def measure(level: float, step: str) -> gp.LevelPoint:
        p = _point(level, level <= 2, 10 * level, clear=level != 3)
        if level == 3:
            p.terms["ttft_p99"] = gp.Term(55.0, 50.0, 45.0, 70.0, "marginal")
        return p

    r = gp.search(measure, [1, 2, 4], "concurrency")
    assert r.edge_note == ("between c=2 (meets the SLO) and c=3 (does not); uncertain: the interval of c=3 "
                           "(ttft_p99) straddles its limit")


def test_knee() -> None:
    assert gp.knee(["a", "b", "c", "d"], [100, 192, 200, 201])[0] == 1  # 192 is within 5% of 201
    i, note = gp.knee(["a", "b", "c"], [100, 200, 400])
    assert i is None and note == "not reached: output tok/s still grew 100% from b to c; saturation at least 400 tok/s"
    assert gp.knee(["a", "b"], [100, 101])[0] == 0
    assert gp.knee(["a"], [100])[0] is None
    assert gp.knee(["a", "b", "c"], [100, math.nan, 100.5])[0] == 0


def test_slo_terms_are_checked_before_anything_runs() -> None:
    with pytest.raises(InputError, match="needs --slo"):
        gp.slo_metrics({})
    with pytest.raises(InputError, match="--slo goodput_p99"):
        gp.slo_metrics({"goodput_p99_ms": 5.0})
    assert set(gp.slo_metrics({"ttft_p95_ms": 500.0, "itl_p99_ms": 50.0})) == {"ttft_p95", "itl_p99"}
    assert meets({"ttft_p99_ms": 10.0}, {"ttft_p99_ms": 50.0}) is True
    assert meets({"ttft_p99_ms": 60.0}, {"ttft_p99_ms": 50.0}) is False
    assert meets({}, {"ttft_p99_ms": 50.0}) is None


def test_level_point_judges_each_term_with_its_interval() -> None:
    from diagnose.pipeline import analyze

    a = analyze(SAMPLES / "vllm_cpu_healthy" / "bundle")
    ttft50 = a.signals["ttft_p50_ms"].value
    p = gp.level_point(a, 2, "c=2", {"ttft_p50_ms": ttft50 * 3, "itl_p50_ms": 0.001})
    assert p.terms["ttft_p50"].value == pytest.approx(ttft50)  # the analysis's own number
    assert p.terms["ttft_p50"].status == "meets" and p.terms["ttft_p50"].lo <= ttft50 <= p.terms["ttft_p50"].hi
    assert p.terms["itl_p50"].status == "fails" and not p.meets and p.clear
    assert p.output_tps == pytest.approx(a.signals["output_tps"].value)
    q = gp.level_point(a, 2, "c=2", {"ttft_p50_ms": p.terms["ttft_p50"].hi - 1e-6})
    assert q.terms["ttft_p50"].status == "marginal" and q.meets and not q.clear


def test_sweep_report_has_the_throughput_latency_curve(tmp_path: Path) -> None:
    from diagnose.pipeline import analyze
    from diagnose.reports.render import render_html
    from diagnose.reports.view_model import build_view

    a = analyze(SAMPLES / "vllm_cpu_queue_bound_sweep" / "bundle")
    spec = build_view(a)["charts"]["curve"]
    assert spec is not None and spec["x_label"] == "output tok/s"
    names = [s["name"] for s in spec["series"]]
    assert names[:4] == ["TTFT P50", "TTFT P99", "ITL P50", "ITL P99"]
    assert any(n.startswith("knee (saturation): c=") for n in names)
    levels = [p for p in a.phases if not p.is_baseline]
    assert len(spec["series"][0]["points"]) == len(levels)
    html = render_html(a)
    assert "Throughput vs latency, one point per level" in html
    one = analyze(SAMPLES / "vllm_cpu_healthy" / "bundle")
    assert build_view(one)["charts"]["curve"] is None  # one level: no curve


def test_curve_marks_the_slo_and_the_edge() -> None:
    from diagnose.reports.curve import curve_spec

    rows = [{"label": f"c={c}", "output_tps": t, "ttft_p50": p50, "ttft_p99": p50 * 2, "itl_p50": 5.0,
             "itl_p99": 9.0, "ttft_p90": p50 * 1.5} for c, t, p50 in ((1, 100, 20), (2, 190, 22), (4, 200, 90))]
    spec = curve_spec(rows, {"ttft_p90_ms": 60.0}, knee="c=2", max_goodput="c=2")
    assert spec is not None
    by = {s["name"]: s for s in spec["series"]}
    assert by["TTFT P90"]["points"] == [[100.0, 30.0], [190.0, 33.0], [200.0, 135.0]]
    assert by["SLO ttft_p90 60 ms"]["points"] == [[100.0, 60.0], [200.0, 60.0]]
    assert by["knee (saturation): c=2"]["points"] == [[190.0, 44.0]] and "max goodput: c=2" in by
    assert curve_spec(rows[:1], {}) is None
    # each point of the first line names its level (throughput can turn back as load rises), escaped
    assert by["TTFT P50"]["labels"] == ["c=1", "c=2", "c=4"] and "labels" not in by["TTFT P99"]
    from diagnose.reports.render import svg

    rows[2]["label"] = "c=<4>"
    drawn = svg(curve_spec(rows, {}))
    assert 'class="point-label"' in drawn and ">c=2</text>" in drawn and "c=&lt;4&gt;" in drawn
    assert "c=<4>" not in drawn


# -- the command, against a server with 4 slots ----------------------------------------------------------------
def test_find_max_goodput_finds_the_servers_capacity(tmp_path: Path) -> None:
    """4 slots, 20 ms to the first token, 16 tokens 5 ms apart: up to c=4 no request waits (TTFT ~21 ms); at
    c=5 and above some wait a whole request (~100 ms) for a slot, so TTFT P90 <= 60 ms holds up to c=4."""
    with fault_server("--slots", "4", "--first-ms", "20", "--tokens", "16", "--itl-ms", "5") as (url, _):
        p = subprocess.run([*DIAG, "attach", "--url", url, "--find-max-goodput", "-c", "2:8:x2", "--slo",
                            "ttft_p90=60ms", "-n", "40", "--output-tokens", "16", "--input-tokens", "32",
                            "--baseline", "2", "--no-nvml", "-o", str(tmp_path / "gp")],
                           capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = orjson.loads((tmp_path / "gp" / "search.json").read_bytes())
    assert r["max_goodput"] == "c=4" and r["first_failing"] == "c=5", p.stdout
    assert [x["label"] for x in r["points"]] == ["c=2", "c=4", "c=8", "c=6", "c=5"]
    assert [x["step"] for x in r["points"]] == ["ladder"] * 3 + ["bisection"] * 2
    assert r["saturation"] == "c=4"
    assert p.stdout.startswith("max goodput: c=4:") and "Traceback" not in p.stderr
    for x in r["points"]:
        assert (tmp_path / "gp" / "levels" / x["label"] / "manifest.json").is_file()
    first = orjson.loads((tmp_path / "gp" / "levels" / "c=2" / "manifest.json").read_bytes())
    later = orjson.loads((tmp_path / "gp" / "levels" / "c=4" / "manifest.json").read_bytes())
    assert [ph["role"] for ph in first["workload"]["phases"]] == ["baseline", "measure"]
    assert [ph["role"] for ph in later["workload"]["phases"]] == ["measure"]  # the reference once
    assert later["options"]["slo"] == {"ttft_p90_ms": 60.0}
    html = (tmp_path / "gp" / "report.html").read_text()
    assert "Throughput vs latency, one point per level" in html and "max goodput: c=4" in html
    assert "http://" not in html.replace(url, "")


def test_find_max_goodput_bad_input_is_one_line(tmp_path: Path) -> None:
    for args, msg in ((["--find-max-goodput"], "needs --slo"),
                      (["--find-max-goodput", "--slo", "ttft_p99=1s", "--observe"], "drop --observe"),
                      (["--find-max-goodput", "--slo", "ttft_p99=1s", "--search-steps", "-1"], "--search-steps -1")):
        p = diagnose("attach", "--url", "http://127.0.0.1:9", *args, "-o", str(tmp_path / "x"))
        assert p.returncode != 0 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
    # nothing answers: the first capture fails, named with its level and bundle, in one line
    p = diagnose("attach", "--url", "http://127.0.0.1:9", "--find-max-goodput", "--slo", "ttft_p99=1s", "-c", "1,2",
                 "-n", "4", "--no-nvml", "-o", str(tmp_path / "y"))
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert "the capture at c=1 into" in p.stderr and len(p.stderr.strip().splitlines()) <= 3, p.stderr
