"""Capacity and cost from an SLO-edge search (diagnose/runs/capacity.py, `diagnose capacity`; issue 38): the
load a replica serves within the SLO with the measurement's spread and the edge's uncertainty, the replicas a
target rate needs, their cost per hour and per million output tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.errors import InputError
from diagnose.runs import capacity as cap
from diagnose.runs import goodput as gp


def _point(level: float, ok: bool, goodput: float, ratio: float, tps: float, lo: float, hi: float) -> gp.LevelPoint:
    t = gp.Term(10.0 if ok else 90.0, 50.0, math.nan, math.nan, "meets" if ok else "fails")
    return gp.LevelPoint(level=level, label=f"c={int(level)}", source="", valid=True, requests=100, meets=ok,
                         clear=True, terms={"ttft_p99": t}, output_tps=tps, output_tps_lo=lo, output_tps_hi=hi,
                         goodput_rps=goodput, goodput_ratio=ratio)


def search_json(tmp_path: Path, failing: bool = True) -> Path:
    """c=4 meets the SLO: 2 good req/s, 256 tok/s (interval 230-280); c=8 fails it: 1.5 good of 3 req/s."""
    pts = [_point(2, True, 1.0, 1.0, 128.0, 120.0, 136.0), _point(4, True, 2.0, 1.0, 256.0, 230.0, 280.0)]
    if failing:
        pts.append(_point(8, False, 1.5, 0.5, 384.0, 350.0, 400.0))
    r = gp.SearchResult("concurrency", {"ttft_p99_ms": 50.0}, pts, pts[1], pts[2] if failing else None, None,
                        "not reached", "between c=4 and c=8", "c=8 failed the SLO")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "search.json").write_text(json.dumps(r.to_json()))
    return tmp_path / "s"


def test_replicas_and_cost_for_a_target_with_their_range(tmp_path: Path) -> None:
    data = cap.read_search(search_json(tmp_path))
    c = cap.capacity(data, target_rate=200.0, price_per_hour=2.0)
    r = c["per_replica"]
    assert r["level"] == "c=4" and r["goodput_rps"] == 2.0
    assert r["goodput_rps_lo"] == pytest.approx(2.0 * 230 / 256)  # the throughput interval's lower end
    assert r["goodput_rps_hi"] == 3.0 and r["first_failing_rps"] == 3.0  # the SLO broke at c=8's 3 req/s
    assert r["output_tokens_per_request"] == 128.0
    assert r["cost_per_mtok"] == pytest.approx(2.0 / (256 * 3600) * 1e6)
    assert r["cost_per_mtok_lo"] == pytest.approx(2.0 / (280 * 3600) * 1e6)
    t = c["target"]
    assert (t["replicas"], t["replicas_lo"], t["replicas_hi"]) == (100, 67, 112)
    assert (t["cost_per_hour"], t["cost_per_hour_lo"], t["cost_per_hour_hi"]) == (200.0, 134.0, 224.0)
    assert t["cost_per_mtok"] == pytest.approx(200.0 / (200 * 128 * 3600) * 1e6)
    text = "\n".join(cap.lines(c))
    assert "target 200 req/s: 100 replica(s) (range 67 to 112)" in text and "$200/h" in text


def test_without_a_failing_level_the_range_is_the_measurements_own(tmp_path: Path) -> None:
    c = cap.capacity(cap.read_search(search_json(tmp_path, failing=False)), target_rate=10.0)
    assert c["per_replica"]["goodput_rps_hi"] == pytest.approx(2.0 * 280 / 256)
    assert c["target"]["replicas"] == 5 and "cost_per_hour" not in c["target"]


def test_cli_writes_json_and_refuses_bad_input(tmp_path: Path) -> None:
    s = search_json(tmp_path)
    r = CliRunner().invoke(cli, ["capacity", str(s), "--target-rate", "200", "--cost-per-hour", "0.5x4",
                                 "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    js: dict[str, Any] = json.loads((tmp_path / "c.json").read_text())
    assert js["price_per_hour"] == 2.0 and js["target"]["replicas"] == 100
    for args, why in (([str(tmp_path / "nope")], "no such file"), ([str(s), "--target-rate", "0"], "positive rate"),
                      ([str(s), "--cost-per-hour", "abc"], "--cost-per-hour")):
        bad = CliRunner().invoke(cli, ["capacity", *args])
        assert bad.exit_code != 0 and why in bad.output and "Traceback" not in bad.output, bad.output
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(InputError, match="not an SLO-edge search"):
        cap.read_search(tmp_path / "x.json")
    # a FIFO (given, or as the folder's search.json) is refused at once: reading it would wait for a writer
    import os

    (tmp_path / "f").mkdir()
    os.mkfifo(tmp_path / "f" / "search.json")
    for given in (tmp_path / "f" / "search.json", tmp_path / "f"):
        with pytest.raises(InputError, match="a FIFO"):
            cap.read_search(given)


def test_no_level_within_the_slo_is_said_and_fails(tmp_path: Path) -> None:
    pts = [_point(2, False, 0.1, 0.1, 10.0, 9.0, 11.0)]
    r = gp.SearchResult("concurrency", {}, pts, None, pts[0], None, "", "no level tried met the SLO", "")
    (tmp_path / "search.json").write_text(json.dumps(r.to_json()))
    res = CliRunner().invoke(cli, ["capacity", str(tmp_path / "search.json"), "--target-rate", "5"])
    assert res.exit_code == 1 and "no level met the SLO" in res.output
