"""Fleet capture from a Prometheus query API, end to end on answers recorded from a real Prometheus scraping two
real vLLM CPU replicas (one driven with 8 concurrent streams at --max-num-seqs 4, the other idle;
tests/data/fleet), and every bad input: one line, non-zero exit."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from diagnose.cli.main import cli
from diagnose.io.bundle import open_bundle
from diagnose.pipeline import analyze
from diagnose.reports.sections import build_sections
from tests.fleet_prom import FakePrometheus, load_recording, serve

LOADED, IDLE = "instance=127.0.0.1:52503", "instance=127.0.0.1:60649"  # the recorded replicas
SEL = '{job="vllm"}'


def attach(url: str, out: Path, *extra: str) -> Result:
    return CliRunner().invoke(cli, ["attach", "--prometheus", url, "--selector", SEL, "--since", "40s", "-o", str(out),
                                    *extra])


def one_line_error(r: Result) -> str:
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("diagnose: error:"), r.stderr
    assert "Traceback" not in r.stderr
    return lines[-1]


def _capture(tmp_path: Path, recording: dict[str, Any] | None = None) -> tuple[Path, FakePrometheus]:
    fake = FakePrometheus(recording or load_recording())
    with serve(fake) as url:
        r = attach(url, tmp_path / "b")
    assert r.exit_code == 0, r.stderr
    assert not fake.unmatched, f"queries the recording does not hold: {fake.unmatched}"
    return tmp_path / "b", fake


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FakePrometheus]:
    return _capture(tmp_path_factory.mktemp("fleet"))


def test_capture_writes_a_fleet_bundle_with_a_stream_per_replica(captured: tuple[Path, FakePrometheus]) -> None:
    path, fake = captured
    b = open_bundle(path)
    reps = b.records("fleet_replicas")
    assert sorted(r["name"] for r in reps) == sorted([LOADED, IDLE])
    assert b.manifest["target"]["engine"] == "vllm" and b.manifest["options"]["fleet"]["selector"] == SEL
    assert b.manifest["probes"]["fleet"]["state"] == "ok"
    # full resolution: one record per replica x scrape, the metrics stream's sample shape, for the replicas picked
    detail = b.records("fleet_metrics")
    by_rep = {r["replica"] for r in detail}
    assert by_rep == {r["replica"] for r in reps if r["detail"]}
    assert all(isinstance(s[0], str) and isinstance(s[1], dict) for s in detail[0]["samples"])
    loaded = next(r for r in reps if r["name"] == LOADED)
    assert "busiest" in loaded["why"] and "most queued" in loaded["why"]
    # aggregation pushed to the server: every query groups by the replica labels; the raw pulls pin one replica
    queries = [q for p, q in fake.seen if p.endswith(("/query", "/query_range")) and q != "1"]
    raw = [q for q in queries if q.startswith("{__name__=~")]
    assert len(raw) == len(by_rep) and all('instance="127.0.0.1:' in q for q in raw)
    assert all("by (job, namespace, pod, instance" in q for q in queries if q not in raw)
    assert any("rate(vllm:e2e_request_latency_seconds_sum" in q for q in queries)
    assert any(q.startswith("histogram_quantile(0.99") for q in queries)
    assert len(b.records("fleet_queries")) == len(fake.seen)


def test_analysis_names_the_loaded_replica_and_the_imbalance(captured: tuple[Path, FakePrometheus]) -> None:
    a = analyze(captured[0])
    reps = a.tables["fleet_replicas"].set_index("name")
    assert reps.loc[LOADED, "load_mean"] > 4 and reps.loc[IDLE, "load_mean"] < 0.1
    assert reps.loc[LOADED, "waiting_mean"] > 1 and reps.loc[LOADED, "request_rps"] > 1
    assert a.signals["fleet_load_imbalance_ratio"].value == pytest.approx(2.0, abs=0.01)
    assert a.signals["fleet_load_busiest_mean"].description == LOADED
    assert a.signals["fleet_load_idlest_mean"].description == IDLE
    ids = [f.rule_id for f in a.findings]
    assert ids[:2] == ["FLT002", "FLT001"], ids
    top = a.findings[0]
    assert LOADED in top.title and IDLE in top.title and "queues 2.3 requests" in top.title
    imb = a.findings[1]
    assert imb.explained_by == "FLT002" and LOADED in imb.title and "2.0x" in imb.title
    assert a.verdict is not None and LOADED in str(a.verdict)
    assert "FLT003" not in ids and "FLT004" not in ids  # one replica has prefix counters only; nothing restarted


def test_the_replicas_pulled_whole_are_normalised_like_one_server(captured: tuple[Path, FakePrometheus]) -> None:
    a = analyze(captured[0])
    d = a.tables["fleet_detail"]
    loaded = d[(d["name"] == LOADED) & (d["signal"] == "queue_depth")]
    assert len(loaded) > 20 and loaded["value"].max() >= 3  # 8 streams, 4 batch slots: 4 wait at times
    finished = d[(d["name"] == LOADED) & (d["signal"] == "finished_requests")]["delta"].dropna()
    assert finished.sum() > 30
    idle = d[(d["name"] == IDLE) & (d["signal"] == "running_requests")]
    assert len(idle) > 20 and idle["value"].max() == 0


def test_report_has_a_per_replica_table(captured: tuple[Path, FakePrometheus], tmp_path: Path) -> None:
    a = analyze(captured[0])
    secs = {s.id: s for s in build_sections(a.tables, a.signals, a.run_window)}
    table = secs["fleet_replicas"].payload
    assert [r[0] for r in table.rows] == [LOADED, IDLE]  # busiest first
    assert "in flight (mean)" in table.columns and "labels" in table.columns
    assert "fleet_load" in secs
    from diagnose.reports.render import write_report

    write_report(a, tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "Replicas (2)" in html and LOADED in html


def _set_total(rec: dict[str, Any], fragment: str, instance: str, value: float) -> None:
    for c in rec["calls"]:
        if c["path"] == "/api/v1/query" and fragment in c["query"]:
            for r in c["response"]["result"]:
                if r["metric"].get("instance") == instance.split("=", 1)[1]:
                    r["value"][1] = str(value)
            return
    raise AssertionError(f"no recorded query has {fragment}")


def test_a_restarted_replica_is_named(tmp_path: Path) -> None:
    rec = copy.deepcopy(load_recording())
    _set_total(rec, "changes(process_start_time_seconds", IDLE, 1)
    a = analyze(_capture(tmp_path, rec)[0])
    f = next(f for f in a.findings if f.rule_id == "FLT004")
    assert IDLE in f.title and "(1x)" in f.title and LOADED not in f.title
    assert a.signals["fleet_restarts_total"].value == 1
    assert "restarted" in next(r for r in open_bundle(tmp_path / "b").records("fleet_replicas") if r["name"] == IDLE)["why"]


def test_prefix_cache_hit_rates_that_differ_by_replica(tmp_path: Path) -> None:
    rec = copy.deepcopy(load_recording())
    _set_total(rec, "increase(vllm:prefix_cache_queries_total", IDLE, 1000)
    _set_total(rec, "increase(vllm:prefix_cache_hits_total", IDLE, 900)
    a = analyze(_capture(tmp_path, rec)[0])
    assert a.signals["fleet_prefix_hit_max_ratio"].value == pytest.approx(0.9)
    f = next(f for f in a.findings if f.rule_id == "FLT003")
    assert f"90% on {IDLE}" in f.title and LOADED in f.title


def test_no_replica_labels_is_an_error(tmp_path: Path) -> None:
    rec = copy.deepcopy(load_recording())
    for c in rec["calls"]:
        res = c["response"].get("result") if isinstance(c["response"], dict) else None
        for r in res or []:
            r["metric"] = {}
    fake = FakePrometheus(rec)
    with serve(fake) as url:
        r = attach(url, tmp_path / "b")
    assert r.exit_code == 3 and "no engine series with any of the replica labels" in one_line_error(r)


# -- bad input ---------------------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_prometheus(tmp_path: Path) -> None:
    r = attach(f"http://127.0.0.1:{_closed_port()}", tmp_path / "b")
    assert r.exit_code == 3
    assert "cannot reach Prometheus at http://127.0.0.1:" in one_line_error(r)
    assert "connection refused" in r.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(("status", "body", "raw", "want"), [
    (400, {"status": "error", "errorType": "bad_data", "error": "invalid parameter \"query\": 1:2: parse error"},
     None, "answered HTTP 400: bad_data: invalid parameter"),
    (503, {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}, None,
     "answered HTTP 503: unavailable: TSDB not ready"),
    (502, None, b"<html>Bad Gateway</html>", "answered HTTP 502: the answer is not the query API's JSON: <html>Bad"),
    (200, None, b"not json", "answered HTTP 200: the answer is not the query API's JSON"),
    (401, {"status": "error", "errorType": "unauthorized", "error": "no token"}, None, "HTTP 401"),
])
def test_http_errors_are_one_line(tmp_path: Path, status: int, body: Any, raw: bytes | None, want: str) -> None:
    with serve(FakePrometheus(status=status, body=body, raw=raw)) as url:
        r = attach(url, tmp_path / "b")
    assert r.exit_code == 3
    line = one_line_error(r)
    assert want in line and "/api/v1/" in line


def test_a_selector_matching_nothing(tmp_path: Path) -> None:
    with serve(FakePrometheus(body={"status": "success", "data": []})) as url:
        r = attach(url, tmp_path / "b")
    assert r.exit_code == 3
    line = one_line_error(r)
    assert f"--selector {SEL}: matches no series at http://127.0.0.1:" in line


def test_an_empty_result_everywhere(tmp_path: Path) -> None:
    """The names exist but every query comes back empty (a window where nothing was scraped)."""
    rec = {"calls": [c for c in load_recording()["calls"] if c["path"].startswith("/api/v1/label/")]}
    fake = FakePrometheus(rec)
    with serve(fake) as url:
        r = attach(url, tmp_path / "b")
    assert r.exit_code == 3 and "no engine series with any of the replica labels" in one_line_error(r)


def test_no_engine_metrics_under_the_selector(tmp_path: Path) -> None:
    with serve(FakePrometheus(body={"status": "success", "data": ["up", "node_cpu_seconds_total"]})) as url:
        r = attach(url, tmp_path / "b")
    assert r.exit_code == 3 and "2 metric names" in one_line_error(r) and "vllm:" in r.stderr


@pytest.mark.parametrize(("args", "code", "want"), [
    (["--prometheus", "localhost:9090"], 2, "expected http://HOST:PORT"),
    (["--prometheus", "http://127.0.0.1:1", "--selector", 'job="vllm"}'], 2, "expected label matchers in braces"),
    (["--prometheus", "http://127.0.0.1:1", "--selector", "{job}"], 2, "is not a label matcher"),
    (["--prometheus", "http://127.0.0.1:1", "--since", "soon"], 2, "bad duration 'soon'"),
    (["--prometheus", "http://127.0.0.1:1", "--url", "http://127.0.0.1:2"], 2, "leave out --url"),
    (["--prometheus", "http://127.0.0.1:1", "--observe", "--since", "1h"], 2, "give one of them"),
    (["--prometheus", "http://127.0.0.1:1", "-d", "1m"], 2, "needs --observe"),
])
def test_bad_options(args: list[str], code: int, want: str) -> None:
    r = CliRunner().invoke(cli, ["attach", *args])
    assert r.exit_code == code and want in one_line_error(r)


def test_attach_without_url_or_prometheus_is_a_usage_error() -> None:
    r = CliRunner().invoke(cli, ["attach"])
    assert r.exit_code == 2 and "Missing option '--url'" in r.stderr and "--prometheus" in r.stderr


def test_observe_mode_reads_the_window_it_watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--observe waits --duration from now (no load is sent), then reads exactly that window."""
    import time
    from types import SimpleNamespace

    import diagnose.fleet.attach as fa

    slept: list[float] = []
    offset = [0.0]

    real_sleep = asyncio.sleep

    async def fast_sleep(s: float, *a: Any) -> None:  # the 40 s pass at once: the clock jumps
        if s <= 0:
            return await real_sleep(0)
        slept.append(s)
        offset[0] += s

    monkeypatch.setattr(fa.asyncio, "sleep", fast_sleep)
    monkeypatch.setattr(fa, "time", SimpleNamespace(time=lambda: time.time() + offset[0], strftime=time.strftime))
    fake = FakePrometheus(load_recording())
    with serve(fake) as url:
        r = CliRunner().invoke(cli, ["attach", "--prometheus", url, "--selector", SEL, "--observe", "-d", "40s",
                                     "-o", str(tmp_path / "b")])
    assert r.exit_code == 0, r.stderr
    assert slept == [40.0] and "no requests are sent" in r.stderr and not fake.unmatched
    b = open_bundle(tmp_path / "b")
    assert b.manifest["workload"]["mode"] == "observe" and not b.has_stream("requests")
    fleet = b.manifest["options"]["fleet"]
    assert fleet["end_unix_s"] - fleet["start_unix_s"] == 40
    a = analyze(tmp_path / "b")
    assert a.findings[0].rule_id == "FLT002" and LOADED in a.findings[0].title


def test_the_recording_is_what_a_real_prometheus_answered() -> None:
    rec = load_recording()
    assert rec["since_s"] == 40 and rec["selector"] == SEL
    running = next(c for c in rec["calls"] if "vllm:num_requests_running{" in c["query"] and "range" in c["path"])
    by = {r["metric"]["instance"]: [float(v) for _t, v in r["values"]] for r in running["response"]["result"]}
    assert len(by) == 2 and max(by["127.0.0.1:52503"]) == 4 and max(by["127.0.0.1:60649"]) == 0
    assert all(not math.isnan(v) for vs in by.values() for v in vs)
    assert json.dumps(rec).count("__name__") > 10


def test_queries_follow_the_engine_maps() -> None:
    from diagnose.fleet.queries import FleetQueries, replica_name

    tgi = FleetQueries("tgi", ["tgi_queue_size", "tgi_batch_current_size", "tgi_request_success",
                               "tgi_request_queue_duration_bucket", "tgi_request_queue_duration_sum",
                               "tgi_request_queue_duration_count"], '{job="tgi", namespace=~"prod|canary"}')
    rq = {q.key: q.promql for q in tgi.range_queries(4.0)}
    assert rq["running"] == 'sum by (job, namespace, pod, instance) (tgi_batch_current_size{job="tgi", ' \
                           'namespace=~"prod|canary"})'
    assert rq["request_rate"].endswith('(rate(tgi_request_success{job="tgi", namespace=~"prod|canary"}[4s]))')
    assert "kv_usage" not in rq  # TGI has no KV-usage gauge in the map: not asked
    assert tgi.counter_renames() == {"tgi_request_success": "tgi_request_success_total"}
    tq = {q.key for q in tgi.total_queries(3600)}
    assert {"requests", "queue_time_mean_s", "counter_resets"} <= tq and "ttft_p99_s" not in tq  # no TTFT histogram
    # sglang's prefix hits are a label filter on one counter
    sg = FleetQueries("sglang", ["sglang:prefill_effective_tokens_total"], None)
    hits = next(q.promql for q in sg.total_queries(60) if q.key == "prefix_hits")
    assert 'sglang:prefill_effective_tokens_total{mode=~".*_hit"}[60s]' in hits
    # renamed vLLM metrics: the first name the fleet has
    old = FleetQueries("vllm", ["vllm:gpu_cache_usage_perc"], None)
    assert next(q.promql for q in old.range_queries(4) if q.key == "kv_usage").endswith("(vllm:gpu_cache_usage_perc)")
    detail = old.detail_selector({"job": "vllm", "instance": 'a"b:1'})
    assert detail == '{__name__=~"vllm:gpu_cache_usage_perc", job="vllm", instance="a\\"b:1"}'
    assert replica_name((("job", "v"), ("namespace", "prod"), ("pod", "vllm-2"), ("instance", "10.0.0.7:80"))) \
        == "namespace=prod,pod=vllm-2"


def test_rule_texts_name_replicas_through_label_fields(tmp_path: Path) -> None:
    """{label.<signal>} prints the signal's description (a fleet signal's replica); lint holds it to the catalogue."""
    from diagnose.model import Signal
    from diagnose.rules.engine import render_text
    from diagnose.rules.lint import lint
    from tests.test_signal_catalog import CASES_DIR, _user_rule

    sigs = {"fleet_load_busiest_mean": Signal("fleet_load_busiest_mean", 6.2, "requests", "server", LOADED)}
    text = "{label.fleet_load_busiest_mean} has {fleet_load_busiest_mean:.1f}; {label.fleet_load_idlest_mean} idles"
    assert render_text(text, sigs, {}) == f"{LOADED} has 6.2; unknown idles"
    ok = lint([_user_rule(tmp_path / "a", title="on {label.fleet_load_busiest_mean}")], [CASES_DIR])
    assert ok == []
    bad = lint([_user_rule(tmp_path / "b", title="on {label.fleet_load_busiest_men}")], [CASES_DIR])
    assert any("fleet_load_busiest_men" in p and "{label.fleet_load_busiest_men}" in p for p in bad), bad
