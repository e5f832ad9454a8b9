"""`diagnose readiness`'s folder is also a capture bundle (issue 37): every request its checks send, recorded in
the load probe's schema as it ends, one phase per check, per part of the overload check and per step of its
ramp; readiness.json and readiness.html as before, and its artifacts. `diagnose analyze` opens it.

The servers are the ones tests/test_readiness.py uses: truth_server (releases aborted streams at once, serves
every request) in this process's CLI, and launched by the run itself for the cold-start and failure checks.
Each count in the bundle is compared with what readiness.json measured from the same requests.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from diagnose.cli import exits
from diagnose.io.writer import BundleWriter
from diagnose.probes.sse import StreamResult, now_ns
from diagnose.readiness import record
from tests.cli_inproc import diagnose
from tests.servers.truth import HERE, answers, free_port, truth_server

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "readiness_vllm_cpu"
BEFORE = Path(__file__).resolve().parent / "data" / "readiness" / "before_bundle_readiness.json"
# the cancellation check as tests/test_readiness.py runs it (6 streams of 300 tokens 10 ms apart, 3 aborted), then
# the overload check in seconds: capacity by 4 streams over 0.5 s, four ramp steps of 0.5 s, 8-token requests
CHECKS = ("--checks", "cancellation,overload", "--cancel-tokens", "300", "--cancel-streams", "6", "--cancel-dwell",
          "0.5", "--overload-step", "0.5", "--overload-capacity-time", "0.5", "--overload-concurrency", "4",
          "--overload-tokens", "8")
RAMP = ["overload ramp 0.5x", "overload ramp 1x", "overload ramp 1.5x", "overload ramp 2x"]
# the overload check's outcomes as the records' error categories
OUTCOME = {"rejected_429": "http_429", "rejected_503": "http_5xx", "unfinished": "incomplete"}
PROMPT_WORDS = ("lighthouse", "harbour", "Readiness check", "Overload check")  # in the checks' prompts


def _jsonl(p: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _by_phase(out: Path) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The bundle's phases by name, and its request records by their phase's name."""
    phases = _jsonl(out / "phases.jsonl")
    names = {p["phase"]: p["name"] for p in phases}
    reqs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in _jsonl(out / "requests.jsonl"):
        reqs[names.get(r["phase"], "?")].append(r)
    return {p["name"]: p for p in phases}, reqs


def _expected(doc: dict[str, Any]) -> list[str]:
    """The phases of a cancellation + overload run, in order (a second cancellation try when the first had too
    few streams open at the abort: a loaded host)."""
    again = ["cancellation, second try"] if "first_try" in doc["measurements"]["cancellation"] else []
    return ["cancellation", *again, "overload baseline", "overload capacity", *RAMP, "overload recovery"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """One readiness run of the cancellation and overload checks on truth_server."""
    out = tmp_path_factory.mktemp("ready") / "r"
    with truth_server(ttft_ms=5, itl_ms=10) as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), *CHECKS)
    # 0, or 1 had the card failed a check: the bundle is what is tested here, whatever the card's judgement
    assert r.returncode in (0, 1) and (out / "readiness.json").is_file(), (r.stdout, r.stderr)
    return out, r


def test_the_folder_is_a_complete_bundle_with_one_phase_per_check_and_step(run: tuple[Path, Any]) -> None:
    out, _ = run
    doc = json.loads((out / "readiness.json").read_text())
    assert (out / "readiness.json").read_text().lstrip("{ \n").startswith('"schema_version"')
    assert doc["schema_version"] == 1 and (out / "readiness.html").is_file()
    man = json.loads((out / "manifest.json").read_text())
    assert man["schema_version"] == 1 and man["capture"]["complete"] is True and man["capture"]["ended_at"]
    assert man["target"]["url"] == doc["url"] and man["target"]["model"] == "tiny-llama"
    assert man["target"]["engine"] == "vllm" and man["workload"]["mode"] == "readiness"
    assert man["workload"]["checks"] == ["cancellation", "overload"]
    assert set(man["streams"]) == {"requests", "chunks", "phases", "client_health"}
    # the client's self-check over the whole run, as attach records it: the analysis judges late sends on it
    health = [json.loads(line) for line in (out / "client_health.jsonl").read_text().splitlines()]
    assert len(health) >= 10 and all(h["cpu_percent"] is not None for h in health)
    lags = [h["loop_lag_ms"] for h in health if h["loop_lag_ms"] is not None]
    assert lags and max(h["in_flight"] for h in health) >= 1
    # the card and its page are the bundle's artifacts, where they always were
    arts = man["artifacts"]
    assert {n: (a["file"], a["kind"]) for n, a in arts.items()} == {
        "readiness.json": ("readiness.json", "readiness_card"), "readiness.html": ("readiness.html", "readiness_page")}
    assert arts["readiness.json"]["bytes"] == (out / "readiness.json").stat().st_size
    # the probes: the requests' load, and the checks' card
    load, card = man["probes"]["load"], man["probes"]["readiness"]
    n = len(_jsonl(out / "requests.jsonl"))
    assert load["state"] == "ok" and load["detail"]["requests_ok"] + load["detail"]["requests_incomplete"] == n
    assert card["detail"]["checks"] == {c["id"]: c["status"] for c in doc["checks"]}
    assert card["reason"] == doc["verdict"]
    phases, _ = _by_phase(out)
    assert list(phases) == _expected(doc)
    assert [p["phase"] for p in phases.values()] == list(range(len(phases)))
    assert {p["check"] for p in phases.values()} == {"cancellation", "overload"}
    assert [p["role"] for p in phases.values()].count("baseline") == 1 and phases["overload baseline"]["role"] == \
        "baseline"
    assert all(p["start_ns"] <= p["end_ns"] and not p["interrupted"] for p in phases.values())
    m = doc["measurements"]["overload"]
    assert [phases[name]["rate"] for name in RAMP] == [st["rate_rps"] for st in m["steps"]]
    assert [phases[name]["mode"] for name in RAMP] == ["rate"] * 4


def test_the_cancellation_phase_holds_its_streams(run: tuple[Path, Any]) -> None:
    out, _ = run
    m = json.loads((out / "readiness.json").read_text())["measurements"]["cancellation"]
    phases, reqs = _by_phase(out)
    name = "cancellation, second try" if "first_try" in m else "cancellation"  # the try the card judged
    got = reqs[name]
    assert len(got) == m["streams"] == phases[name]["requests"] == 6
    assert phases[name]["concurrency"] == 6 and phases[name]["max_tokens"] == m["max_tokens"]
    # the aborted streams are incomplete (closed by the check), the kept ones completed with every token
    cut = [r for r in got if r["error"] == "incomplete"]
    assert len(cut) == m["aborted"] + m["kept_unfinished"] == 3
    assert all(r["error_detail"].startswith("aborted by the cancellation check") and not r["ok"] for r in cut)
    done = [r for r in got if r["ok"]]
    assert len(done) == m["kept_ok"] == 3 and all(r["output_tokens_chunks"] == m["max_tokens"] for r in done)
    # each stream's tokens as the check counted them (stream_times, in the order sent)
    assert sorted(r["output_tokens_chunks"] for r in got) == sorted(s["tokens"] for s in m["stream_times"])
    assert sum(r["output_tokens_chunks"] for r in cut) == m["aborted_tokens"]


def test_each_overload_part_and_step_holds_the_requests_it_sent(run: tuple[Path, Any]) -> None:
    out, _ = run
    m = json.loads((out / "readiness.json").read_text())["measurements"]["overload"]
    phases, reqs = _by_phase(out)
    base = reqs["overload baseline"]
    assert len(base) == 5 and [round((r["first_token_ns"] - r["sent_ns"]) / 1e6, 3) for r in base] == \
        m["baseline_ttft_ms"]
    assert len(reqs["overload capacity"]) == m["capacity"]["requests"] and phases["overload capacity"][
        "concurrency"] == 4
    for name, st in zip(RAMP, m["steps"], strict=True):
        got = reqs[name]
        assert len(got) == st["sent"] == phases[name]["requests"], (name, st)
        assert Counter("ok" if r["ok"] else r["error"] for r in got) == Counter(
            {OUTCOME.get(k, k): v for k, v in st["outcomes"].items()}), (name, st)
        # the open loop's arrivals: each request's intended send time inside its step, which lasts step_s
        ph = phases[name]
        assert ph["end_ns"] - ph["start_ns"] == 500_000_000
        bad = [r for r in got if not (ph["start_ns"] <= r["intended_ns"] < ph["end_ns"] and r["intended_ns"] <= r["sent_ns"])]
        assert not bad, (ph, bad)
    assert len(reqs["overload recovery"]) == len(m["recovery"]["probes"])
    assert sum(len(v) for v in reqs.values()) == len(_jsonl(out / "requests.jsonl"))  # no request outside a phase


def test_the_ramp_never_sends_before_its_arrival_time_under_uvloop(tmp_path: Path) -> None:
    """uvloop's timers (and a coarse clock's) wake up to a millisecond early: the ramp slept with a bare
    asyncio.sleep and sent 30-50 of ~130 requests up to 1.1 ms before their intended time (a negative schedule
    lag). CI failed the test above so: an in-process capture (tests/test_api.py) had left uvloop's event loop
    policy installed in its worker. Each arrival now sleeps until its time (probes/sse.py sleep_until), and
    attach no longer installs the policy."""
    import asyncio

    import uvloop

    out = tmp_path / "r"
    policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        with truth_server(ttft_ms=5, itl_ms=10) as (url, _):
            r = diagnose("readiness", "--url", url, "-o", str(out), *CHECKS[CHECKS.index("--overload-step"):],
                         "--checks", "overload")
    finally:
        asyncio.set_event_loop_policy(policy)
    assert r.returncode in (0, 1), (r.stdout, r.stderr)
    phases, reqs = _by_phase(out)
    got = [r for name in RAMP for r in reqs[name]]
    assert len(got) >= 20
    early = [(r["sent_ns"] - r["intended_ns"]) / 1e3 for r in got if r["sent_ns"] < r["intended_ns"]]
    assert not early, f"{len(early)} of {len(got)} sent early, by up to {-min(early):.0f} us"


def test_the_records_are_the_load_probes_and_hold_no_text(run: tuple[Path, Any]) -> None:
    out, _ = run
    recs = _jsonl(out / "requests.jsonl")
    keys = {"rid", "phase", "warmup", "api", "intended_ns", "capped", "sent_ns", "headers_ns", "first_token_ns",
            "end_ns", "ok", "http_status", "error", "error_detail", "prompt_tokens", "max_tokens",
            "output_tokens_usage", "output_tokens_chunks", "n_chunks", "finish_reason", "body_bytes"}
    assert all(keys <= set(r) for r in recs) and len({r["rid"] for r in recs}) == len(recs)
    ok = [r for r in recs if r["ok"]]
    assert ok and all(r["sent_ns"] <= r["first_token_ns"] <= r["end_ns"] and r["http_status"] == 200 for r in ok)
    chunks = {c["rid"]: c for c in _jsonl(out / "chunks.jsonl")}
    assert all(len(chunks[r["rid"]]["t_ns"]) == r["n_chunks"] for r in ok)
    raw = (out / "requests.jsonl").read_text() + (out / "chunks.jsonl").read_text()
    assert not any(w in raw for w in PROMPT_WORDS) and "prompt_text" not in raw and "output_text" not in raw


def test_analyze_opens_the_folder_and_lists_its_phases(run: tuple[Path, Any], tmp_path: Path) -> None:
    out, _ = run
    report, js = tmp_path / "report.html", tmp_path / "f.json"
    r = diagnose("analyze", str(out), "-o", str(report), "--json", str(js))
    # 0, or 5 when the load client (this process, on a busy machine) sent the ramp late: the analysis says so
    assert r.returncode in (0, 5), (r.stdout, r.stderr)
    doc = json.loads(js.read_text())
    if r.returncode == 5:
        assert doc["run_valid"] is False and "VAL001" in {f["rule_id"] for f in doc["findings"]}, doc["verdict"]
    # the client's own evidence reached the analysis (VAL001 no longer judges on late sends alone)
    assert "client_loop_lag_p99_ms" in doc["signals"] and "client_cpu_max_percent" in doc["signals"]
    assert [p["name"] for p in doc["phases"]] == _expected(json.loads((out / "readiness.json").read_text()))
    html = report.read_text()
    assert all(name in html for name in RAMP) and "overload recovery" in html
    # read as a person reads it: no template hole (VAL001 without a loop-lag record once read "loop lag P99
    # unknown ms"), and the workload card names how a readiness run sends (it read "Arrivals: unknown")
    from tests.test_report_browser import template_holes

    text = re.sub(r"<[^>]+>", " ", html)
    assert template_holes(text) == [] and ">unknown<" not in html, template_holes(text)
    assert "streams held open and aborted" in html


def test_an_earlier_run_of_the_new_kind_is_judged_again(run: tuple[Path, Any], tmp_path: Path) -> None:
    out, _ = run
    again = tmp_path / "again"
    r = diagnose("readiness", "--from", str(out), "-o", str(again))
    assert r.returncode == run[1].returncode, (r.stdout, r.stderr)
    a, b = json.loads((again / "readiness.json").read_text()), json.loads((out / "readiness.json").read_text())
    assert a["checks"] == b["checks"] and a["measurements"] == b["measurements"]
    assert not (again / "manifest.json").exists()  # the card judged again, not a capture


def test_an_old_folder_is_still_judged_again(tmp_path: Path) -> None:
    """A folder written before the bundle (readiness.json alone, without 'asked' or the checks' 'rule': the
    sample shipped until stop 43, kept as tests/data/readiness/before_bundle_readiness.json) is still read by
    --from; its card comes out the same but for the rule that now names each failed check."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "readiness.json").write_bytes(BEFORE.read_bytes())
    r = diagnose("readiness", "--from", str(old), "-o", str(tmp_path / "a"))
    assert r.returncode == 1, (r.stdout, r.stderr)  # its RDY003 fails, as it shipped
    again = json.loads((tmp_path / "a" / "readiness.json").read_text())
    was = json.loads(BEFORE.read_text())
    assert "asked" not in was and again["asked"] == ["cancellation", "cold-start", "failure", "overload"]
    assert [{k: v for k, v in c.items() if k != "rule"} for c in again["checks"]] == was["checks"]
    assert [c.get("rule") for c in again["checks"]] == [None, None, "RDY032", None]


def test_the_shipped_sample_is_a_bundle_judged_again_as_it_ships(tmp_path: Path) -> None:
    """sample_traces/readiness_vllm_cpu: a readiness run on vLLM CPU whose folder is a bundle (gzipped streams):
    --from gives its card back; analyze opens it, one phase per check and step."""
    assert (SAMPLE / "manifest.json").is_file() and (SAMPLE / "requests.jsonl.gz").is_file()
    assert (SAMPLE / "client_health.jsonl.gz").is_file()
    r = diagnose("readiness", "--from", str(SAMPLE), "-o", str(tmp_path / "a"))
    assert r.returncode == 1, (r.stdout, r.stderr)
    doc = json.loads((SAMPLE / "readiness.json").read_text())
    assert json.loads((tmp_path / "a" / "readiness.json").read_text())["checks"] == doc["checks"]
    js = tmp_path / "f.json"
    r = diagnose("analyze", str(SAMPLE), "-o", str(tmp_path / "r.html"), "--json", str(js))
    assert r.returncode == 0, (r.stdout, r.stderr)
    found = json.loads(js.read_text())
    # the client's self-check is in the bundle: near its limit (VAL006, info), not the bottleneck (VAL001)
    assert found["run_valid"] is True and "client_loop_lag_p99_ms" in found["signals"]
    ramp = [f"overload ramp {f:g}x" for f in doc["measurements"]["overload"]["factors"]]
    assert [p["name"] for p in found["phases"]] == ["cold start", "cancellation", "overload baseline",
                                                    "overload capacity", *ramp, "overload recovery", "failure"]
    assert ramp == ["overload ramp 0.5x", "overload ramp 1x", "overload ramp 2x", "overload ramp 4x"]
    assert found["findings"][0]["rule_id"] == "ERR009"  # the failure check's crash leads


def _truth_cmd(port: int) -> str:
    return f"{sys.executable} {HERE / 'truth_server.py'} --port {port} --ttft-ms 5 --itl-ms 10 --no-uvloop"


def test_a_launched_run_records_the_cold_start_and_the_crash(tmp_path: Path) -> None:
    """truth_server launched: the cold start's 20 requests, then 4 clients across a crash and a restart (short
    plans: 1 s before the crash, 1 s after the recovery). Every attempt is a record of the failure phase, tagged
    with its client, request and retry."""
    from diagnose.readiness import run as rr
    from diagnose.readiness.failure import FailurePlan
    from diagnose.rules.spec import load_thresholds

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "r"
    req = rr.Request(url=url, output=out, launch=_truth_cmd(port), thresholds=load_thresholds(),
                     failure=FailurePlan(before_s=1.0, after_s=1.0, recover_limit_s=60.0),
                     checks=frozenset({"cold-start", "failure"}))
    doc = rr.run(req)
    assert not answers(url)
    phases, reqs = _by_phase(out)
    assert list(phases) == ["cold start", "failure"]
    cm = doc["measurements"]["cold_start"]
    cold = reqs["cold start"]
    assert Counter(r["part"] for r in cold) == {"cold": 4, "warmup": 8, "warm": 8} and all(r["ok"] for r in cold)
    assert [round((r["first_token_ns"] - r["sent_ns"]) / 1e6, 3) for r in cold if r["part"] == "cold"] == \
        cm["cold_ttft_ms"]
    fm = doc["measurements"]["failure"]
    attempts: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in reqs["failure"]:
        if r["part"] == "client":
            attempts[(r["client"], r["request"])].append(r)
    assert all([a["retry"] for a in v] == list(range(len(v))) for v in attempts.values())
    assert max(len(v) for v in attempts.values()) == fm["attempts_per_request_max"]
    assert sum(1 for v in attempts.values() if len(v) > 1 and v[-1]["ok"]) == fm["recovered_by_retry"] >= 1
    assert sum(1 for v in attempts.values() if len(v) > fm["max_retries"] and not v[-1]["ok"]) == fm["lost"]
    assert any(not r["ok"] and r["error"] in ("refused", "reset", "connect") for r in reqs["failure"])
    probes = [r for r in reqs["failure"] if r["part"] == "probe"]
    assert probes and probes[-1]["ok"] and not any(r["ok"] for r in probes[:-1])
    man = json.loads((out / "manifest.json").read_text())
    assert {"server.log", "server-restart.log"} <= set(man["artifacts"])
    assert man["artifacts"]["server.log"]["kind"] == "server_log"
    # the analysis opens it, lists its phases and sees the crash the failure check caused: connections refused,
    # then answered again (ERR009). Exit 0, or INVALID_RUN where the client's own record (its event loop lagging
    # on a loaded machine: 12-19 ms P99 here beside 4 busy processes on 2 cores) makes the run invalid: then the
    # verdict says so first
    report, js = tmp_path / "report.html", tmp_path / "f.json"
    r = diagnose("analyze", str(out), "-o", str(report), "--json", str(js))
    assert r.returncode in (0, exits.INVALID_RUN), (r.stdout, r.stderr)
    found = json.loads(js.read_text())
    client_bound = any(f["rule_id"] == "VAL001" for f in found["findings"])
    assert found["run_valid"] is (not client_bound) and found["verdict"].startswith("Run invalid") is client_bound
    assert r.returncode == (exits.INVALID_RUN if client_bound else 0)
    assert [p["name"] for p in found["phases"]] == ["cold start", "failure"] and found["partial"] is False
    assert "ERR009" in {f["rule_id"] for f in found["findings"]}, found["verdict"]
    assert "cold start" in report.read_text()


def test_a_killed_run_keeps_the_requests_that_finished(tmp_path: Path) -> None:
    """SIGKILL once the cancellation phase is written, during the overload check: the bundle holds the
    cancellation's 6 requests and is read as partial; no card was written."""
    out = tmp_path / "r"
    with truth_server(ttft_ms=5, itl_ms=10) as (url, _):
        proc = subprocess.Popen([sys.executable, "-m", "diagnose", "readiness", "--url", url, "-o", str(out),
                                 *CHECKS, "--overload-step", "5"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not (out / "phases.jsonl").is_file() or "overload baseline" not in (out / "phases.jsonl").read_text():
                assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    assert not (out / "readiness.json").exists()
    man = json.loads((out / "manifest.json").read_text())
    assert man["capture"]["complete"] is False and man["capture"]["ended_at"] is None
    assert man["probes"]["load"]["state"] == "running" and "readiness" not in man["probes"]
    _, reqs = _by_phase(out)
    assert len(reqs["cancellation"]) == 6 and len(reqs["overload baseline"]) == 5
    r = diagnose("analyze", str(out), "-o", str(tmp_path / "report.html"), "--json", str(tmp_path / "f.json"))
    assert r.returncode in (0, 5), (r.stdout, r.stderr)
    assert json.loads((tmp_path / "f.json").read_text())["partial"] is True


def test_the_recorder_writes_records_without_text_and_a_null_one_nothing(tmp_path: Path) -> None:
    bundle = BundleWriter(tmp_path / "b")
    rec = record.Recorder(bundle)
    with rec.phase("cancellation", "cancellation", concurrency=2) as ph:
        rec.sent(ph)
        t = now_ns()
        echo = StreamResult(sent_ns=t, end_ns=t + 5, status=400, error="http_4xx",
                            error_detail="bad request: Readiness check, stream 3: write a long story about the sea")
        rec.request(ph, "Readiness check, stream 3: write a long story about the sea", 8, echo, cut=False)
        rec.sent(ph)
        rec.cut_reason = "aborted by the check"
        rec.request(ph, "x", 8, StreamResult(sent_ns=t, t_ns=[t + 1], tok=[1]), cut=True)
    with pytest.raises(KeyboardInterrupt), rec.phase("overload baseline", "overload", role="baseline"):
        raise KeyboardInterrupt
    phases = _jsonl(tmp_path / "b" / "phases.jsonl")
    assert [(p["name"], p["requests"], p["interrupted"]) for p in phases] == [
        ("cancellation", 2, False), ("overload baseline", 0, True)]
    a, b = _jsonl(tmp_path / "b" / "requests.jsonl")
    assert a["error"] == "http_4xx" and "long story" not in a["error_detail"] and "[prompt text]" in a["error_detail"]
    assert (b["ok"], b["error"], b["error_detail"], b["first_token_ns"]) == (False, "incomplete",
                                                                             "aborted by the check", t + 1)
    assert b["end_ns"] >= t  # closed before it ended: stamped when it was recorded
    assert rec.status("m", {}).detail["requests_incomplete"] == 1
    assert record.Recorder(None).request(0, "p", 1, StreamResult(), cut=False) is None


def test_force_removes_an_earlier_runs_streams_and_keeps_the_server_log(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "requests.jsonl").write_text('{"rid": "old"}\n')
    (out / "server.log").write_text("started\n")
    b = record.open_bundle(out, url="http://h:1", engine="vllm", model="m", source="vllm_metrics",
                           workload={"mode": "readiness"}, options={}, force=True)
    record.Recorder(b)
    b.finish()
    assert (out / "requests.jsonl").read_text() == "" and (out / "server.log").read_text() == "started\n"
    assert json.loads((out / "manifest.json").read_text())["target"]["in_flight_source"] == "vllm_metrics"
