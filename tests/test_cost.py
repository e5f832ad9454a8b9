"""What a run cost (diagnose/signals/cost.py): the price of an hour of the deployment, recorded by `attach
--cost-per-hour` or given to `analyze --cost-per-hour`, as cost per million output tokens, per successful
request and per request within the SLO, in the report's workload card and --json; `compare` reads the recorded
prices when it is given none (issue 16, item 5)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from diagnose import compare as cmp
from diagnose.cli import exits
from diagnose.cli.main import cli
from diagnose.errors import BundleError, InputError
from diagnose.io.manifest import read_manifest
from diagnose.pipeline import analyze
from diagnose.signals.cost import parse_price, per_unit, recorded_price
from diagnose.signals.workload_card import workload_card

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
HEALTHY = SAMPLES / "vllm_cpu_healthy" / "bundle"


def _priced(dst: Path, price: float, slo: dict[str, float] | None = None) -> Path:
    shutil.copytree(HEALTHY, dst)
    m = orjson.loads((dst / "manifest.json").read_bytes())
    m.setdefault("options", {})["cost_per_hour"] = price
    if slo is not None:
        m["options"]["slo"] = slo
    (dst / "manifest.json").write_bytes(orjson.dumps(m))
    return dst


def test_prices_per_hour_and_per_device_hour() -> None:
    assert parse_price("2.5") == 2.5
    assert parse_price("4.1x8") == pytest.approx(32.8)
    assert parse_price(" 3X2 ") == 6.0
    for bad in ("", "abc", "-1", "0", "2x0", "2x-3", "nan", "inf", "2x1.5", "1e999"):
        with pytest.raises(InputError, match="--cost-per-hour"):
            parse_price(bad)


def test_one_definition_of_cost_per_unit() -> None:
    assert per_unit(3.6, 10.0, 1.0) == pytest.approx(1e-4)  # $3.60/h at 10 req/s: $0.0001 a request
    assert per_unit(3.6, 1000.0, 1e6) == pytest.approx(1.0)  # 1000 tok/s: $1 per million tokens
    assert math.isnan(per_unit(3.6, 0.0, 1.0)) and math.isnan(per_unit(3.6, math.nan, 1.0))
    assert recorded_price(read_manifest({"options": {"cost_per_hour": 2}}, "m.json")) == 2.0
    for m in ({}, {"options": {"cost_per_hour": -1}}, {"options": {"cost_per_hour": None}}):
        assert recorded_price(read_manifest(m, "m.json")) is None
    # a price of the wrong type is the manifest's error, one line naming the file and the field
    for m, want in (({"options": {"cost_per_hour": True}}, "options.cost_per_hour: expected a number, got True"),
                    ({"options": "x"}, "field options: expected an object, got 'x'")):
        with pytest.raises(BundleError, match=re.escape(want)) as e:
            read_manifest(m, "m.json")
        assert str(e.value).startswith("m.json: field ") and "\n" not in str(e.value)


def test_the_card_prices_the_run_with_the_slo(tmp_path: Path) -> None:
    a = analyze(_priced(tmp_path / "b", 3.6, {"ttft_p99_ms": 100000.0}))
    card = workload_card(a)
    assert card is not None
    cost = card["cost"]
    assert cost["price_per_hour"] == 3.6
    assert cost["per_request"] == pytest.approx(3.6 / (a.signals["request_rps"].value * 3600))
    assert cost["per_mtok"] == pytest.approx(3.6 / (a.signals["output_tps"].value * 3600) * 1e6)
    assert cost["per_good_request"] == pytest.approx(3.6 / (a.signals["goodput_rps"].value * 3600))


def test_without_an_slo_there_is_no_cost_per_good_request(tmp_path: Path) -> None:
    a = analyze(_priced(tmp_path / "b", 3.6))
    cost = workload_card(a)["cost"]  # type: ignore[index]
    assert cost["per_good_request"] is None and cost["per_request"] > 0
    assert "cost" not in (workload_card(analyze(HEALTHY)) or {})  # no price, no cost


def test_analyze_prices_a_bundle_and_shows_it_once(tmp_path: Path) -> None:
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["analyze", str(HEALTHY), "-o", str(out), "--json", str(js),
                                 "--cost-per-hour", "1.5x2", "-q"])
    assert r.exit_code == 0, r.output
    card = json.loads(js.read_text())["workload_card"]
    assert card["cost"]["price_per_hour"] == 3.0
    html = out.read_text()
    per_req = f"${card['cost']['per_request']:.3g} per request"
    assert "Cost at $3/h" in html and per_req in html and html.count(per_req) == 1
    bad = CliRunner().invoke(cli, ["analyze", str(HEALTHY), "-o", str(out), "--cost-per-hour", "free"])
    assert bad.exit_code == exits.USAGE and "--cost-per-hour 'free'" in bad.output and "Traceback" not in bad.output


def test_compare_reads_the_recorded_prices(tmp_path: Path) -> None:
    """Two captures that recorded their deployment's price: compare prices them without being told, and a
    price on the command line still wins."""
    a, b = _priced(tmp_path / "a", 2.0), _priced(tmp_path / "b", 4.0)
    r = CliRunner().invoke(cli, ["compare", str(a), str(b), "--resamples", "200", "--json", str(tmp_path / "c.json")])
    assert r.exit_code == 0, r.output
    rows = {m["metric"]: m for lv in json.loads((tmp_path / "c.json").read_text())["levels"] for m in lv["metrics"]}
    assert rows["cost_per_request"]["b"] == pytest.approx(2 * rows["cost_per_request"]["a"])
    assert "prices recorded by the captures" in r.output
    assert cmp.recorded_prices(analyze(a), analyze(b)) == (2.0, 4.0)
    assert cmp.recorded_prices(analyze(a), analyze(HEALTHY)) is None  # one side unpriced: nothing assumed


def test_attach_records_the_price_and_refuses_a_bad_one_before_connecting(tmp_path: Path) -> None:
    """A bad price is a one-line error before anything connects (nothing listens on the URL)."""
    r = CliRunner().invoke(cli, ["attach", "--url", "http://127.0.0.1:9", "--cost-per-hour", "cheap", "-o",
                                 str(tmp_path / "b"), "--duration", "1s"])
    assert r.exit_code == exits.USAGE and "--cost-per-hour 'cheap'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "b").exists()


def test_a_priced_capture_against_the_truth_server(tmp_path: Path) -> None:
    """attach --cost-per-hour records the price; its report prices the run (per request, per million tokens)."""
    import subprocess
    import sys

    from diagnose.io.bundle import open_bundle
    from tests.servers.truth import truth_server

    with truth_server(ttft_ms=5, itl_ms=2) as (url, _):
        p = subprocess.run([sys.executable, "-m", "diagnose", "attach", "--url", url, "-c", "2", "-d", "2s",
                            "--output-tokens", "8", "--baseline", "0", "--no-nvml", "--cost-per-hour", "0.5x4",
                            "-o", str(tmp_path / "b"), "--report", str(tmp_path / "r.html")],
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert open_bundle(tmp_path / "b").manifest["options"]["cost_per_hour"] == 2.0
    html = (tmp_path / "r.html").read_text()
    assert "Cost at $2/h" in html and "per million output tokens" in html and "per request within" not in html


def test_an_invalid_run_shows_no_cost_per_request_within_the_slo(tmp_path: Path) -> None:
    """Like goodput, the cost per request within the SLO is a judgement: not shown for an invalid run."""
    from diagnose.reports.view_model import _cost_row

    cost = {"price_per_hour": 2.0, "per_mtok": 1.0, "per_request": 0.01, "per_good_request": 0.02}
    assert "within the SLO" in _cost_row(cost)[0][1]  # type: ignore[operator]
    row = _cost_row(cost, judged=False)[0][1]
    assert row is not None and "within the SLO" not in row and "$0.01 per request" in row



def test_the_price_is_an_argument_of_the_analysis_not_written_into_its_manifest() -> None:
    """Issue 32 item 3: `analyze --cost-per-hour` rewrote the analysis's manifest after the analysis to price the
    run; the price is now the pipeline's argument and the card computed once with it."""
    a = analyze(HEALTHY, cost_per_hour=3.0)
    assert "cost_per_hour" not in (a.manifest.get("options") or {})
    assert a.workload_card is not None and a.workload_card["cost"]["price_per_hour"] == 3.0
    assert "cost" not in (analyze(HEALTHY).workload_card or {})
