"""`diagnose readiness` (issue 37): the readiness card against real streaming servers with known behaviour.

truth_server releases an aborted stream at once (its vllm:num_requests_running drops when the connection closes);
faults.py --leak-cancelled counts every stream whose client left as running for ever: the leak the check must
name. The cold-start check launches truth_server itself. Nothing here asserts a duration against a bound: the
judgements that depend on time are driven with thresholds far from the measured values.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from diagnose.readiness import card
from diagnose.readiness.run import write
from tests.cli_inproc import diagnose
from tests.servers.faults import fault_server
from tests.servers.truth import HERE, answers, free_port, truth_server

# streams of 300 tokens 10 ms apart: open for 3 s, well past the 0.5 s they run together before the abort (a
# loaded machine's late wake-up must not let them end first)
STREAM = ("--cancel-tokens", "300", "--cancel-streams", "6", "--cancel-dwell", "0.5", "--checks", "cancellation")
THR = {card.RELEASE: 5.0, card.COLD_RATIO: 3.0, card.OVER_WAIT: 2.0, card.RECOVERY: 10.0, card.RECOVERED_RATIO: 3.0,
       card.RESTART: 300.0, card.HEALTH_GAP: 5.0, card.AMPLIFICATION: 3.0}
# the overload check in seconds, not the default minute: 2 s a step, capacity by 4 streams over 2 s
OVERLOAD = ("--checks", "overload", "--overload-step", "2", "--overload-capacity-time", "2",
            "--overload-concurrency", "4")


def _doc(out: Path) -> dict[str, Any]:
    raw = (out / "readiness.json").read_text()
    assert raw.lstrip("{ \n").startswith('"schema_version"')
    doc = json.loads(raw)
    assert doc["schema_version"] == 1
    return doc


def _check(doc: dict[str, Any], rid: str) -> dict[str, Any]:
    return next(c for c in doc["checks"] if c["id"] == rid)


def test_a_server_that_releases_aborted_streams_passes(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with truth_server(ttft_ms=5, itl_ms=10) as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), *STREAM)
    assert r.returncode == 0, r.stderr
    doc = _doc(out)
    c = _check(doc, "RDY001")
    assert c["status"] == "pass", c
    m = doc["measurements"]["cancellation"]
    assert (m["aborted"], m["kept"], m["kept_ok"]) == (3, 3, 3)
    assert m["source"] == "vllm_metrics" and doc["target"]["model"] == "tiny-llama"
    assert m["before"]["in_flight"] == 0 and m["release_s"] is not None and m["idle_s"] is not None
    assert m["samples"] and all(s["in_flight"] >= 0 for s in m["samples"])
    # the kept streams' throughput, before and after the abort: each stream's, and the three together
    assert m["kept_tps_per_stream_before"] > 0 and m["kept_tps_per_stream_after"] > 0
    assert m["kept_tps_after"] > m["kept_tps_per_stream_after"]
    assert _check(doc, "RDY002")["status"] == "not run" and _check(doc, "RDY002")["summary"] == card.NOT_ASKED
    assert _check(doc, "RDY003")["status"] == "not run" and doc["measurements"]["overload"] is None
    assert doc["verdict"] == "ready on the checks run" and doc["failed"] == []
    assert "RDY001 cancellation: PASS" in r.stdout
    html = (out / "readiness.html").read_text()
    # the card is the first screen: verdict and card before the numbers' tables
    assert html.index("Readiness card") < html.index("the numbers") and "<script" not in html


def test_a_server_that_keeps_aborted_work_fails_naming_the_leak(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with fault_server("--tokens", "300", "--itl-ms", "10", "--leak-cancelled") as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), *STREAM,
                     "--threshold", "readiness_cancel_release_max_s=0.3")
    assert r.returncode == 1, (r.stdout, r.stderr)
    doc = _doc(out)
    c = _check(doc, "RDY001")
    assert c["status"] == "fail" and doc["failed"] == ["RDY001"]
    assert doc["measurements"]["cancellation"]["leaked"] == 3
    assert c["summary"].startswith("leaked work: 3 request(s) still in flight") and "running 3" in c["summary"]
    assert "disconnect" in c["fix"] and doc["thresholds"][card.RELEASE] == 0.3
    assert "not ready: RDY001 cancellation" in r.stdout and "fix:" in r.stdout
    assert "fail" in (out / "readiness.html").read_text()


def test_a_gauge_stale_after_aborts_is_not_a_leak(tmp_path: Path) -> None:
    """Every stream aborted and a gauge that moves only when a request runs (vLLM's after aborts): one more
    request brings it back to 0, so the work was released; the card passes and says the gauge was stale."""
    out = tmp_path / "r"
    with fault_server("--tokens", "300", "--itl-ms", "10", "--stale-gauge") as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), *STREAM, "--abort-share", "1",
                     "--threshold", "readiness_cancel_release_max_s=0.3")
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = _doc(out)
    m = doc["measurements"]["cancellation"]
    assert (m["aborted"], m["kept"]) == (6, 0) and m["stale_gauge"]["in_flight"] == 6 and "leaked" not in m
    c = _check(doc, "RDY001")
    assert c["status"] == "pass" and "stayed at 6" in c["summary"] and c["fix"] == card.FIX_STALE
    assert m["samples"][-1]["in_flight"] == 0


def test_unreachable_server_is_one_line_and_exit_3(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = diagnose("readiness", "--url", url, "-o", str(tmp_path / "r"))
    assert r.returncode == 3
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"diagnose: error: cannot reach {url}: connection refused")
    assert not (tmp_path / "r" / "readiness.json").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (("--abort-share", "0"), "--abort-share 0"),
    (("--cancel-streams", "1000"), "--cancel-streams 1000"),
    (("--cancel-dwell", "nan"), "--cancel-dwell nan"),
    (("--slo", "ttft_p99=5"), "has no unit"),
    (("--threshold", "nope=1"), "unknown threshold"),
    (("--url", "ftp://x"), "expected http://HOST:PORT"),
    (("--launch", "'unbalanced"), "unbalanced quote"),
    (("--checks", "cancellation,warp"), "--checks cancellation,warp: name one or more of"),
    (("--overload-factors", "2,1"), "rising multiples"),
    (("--overload-factors", "1,x"), "--overload-factors 1,x"),
    (("--overload-step", "0"), "--overload-step 0"),
    (("--overload-max-requests", "5"), "--overload-max-requests 5: use 10 to 100000"),
    (("--overload-capacity", "-3"), "--overload-capacity -3"),
    (("--failure-tokens", "0"), "--failure-tokens 0: use 1 to 4096 tokens"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    base = ["--url", f"http://127.0.0.1:{free_port()}", "-o", str(tmp_path / "r")]
    r = diagnose("readiness", *base, *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0


def test_a_folder_that_is_not_empty_needs_force(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("x")
    r = diagnose("readiness", "--url", f"http://127.0.0.1:{free_port()}", "-o", str(tmp_path))
    assert r.returncode == 2 and "--force" in r.stderr and (tmp_path / "old.txt").exists()


def _truth_cmd(port: int) -> str:
    return f"{sys.executable} {HERE / 'truth_server.py'} --port {port} --ttft-ms 5 --itl-ms 10 --no-uvloop"


def test_launch_times_the_cold_start_and_stops_the_server(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "r"
    # the first request's TTFT over a 1 ms SLO: truth_server's TTFT is 5 ms, so the cold start fails on the SLO
    r = diagnose("readiness", "--url", url, "-o", str(out), "--launch", _truth_cmd(port), *STREAM,
                 "--checks", "cancellation,cold-start", "--slo", "ttft_p99=1ms", "--threshold", "readiness_cold_ttft_ratio_max=1000")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert not answers(url)  # stopped
    doc = _doc(out)
    m = doc["measurements"]["cold_start"]
    assert 0 < m["healthy_s"] <= m["first_token_s"]
    assert len(m["cold_ttft_ms"]) == 4 and len(m["warm_ttft_ms"]) == 8 and m["failed_count"] == 0
    assert all(t >= 5 for t in m["cold_ttft_ms"] + m["warm_ttft_ms"])  # the server's own TTFT is a floor
    c = _check(doc, "RDY002")
    assert c["status"] == "fail" and "over the SLO's 1 ms" in c["summary"] and c["fix"]
    assert c["numbers"]["slo_ttft_ms"] == 1.0 and doc["launch"] == _truth_cmd(port)
    assert _check(doc, "RDY001")["status"] == "pass" and doc["failed"] == ["RDY002"]
    assert (out / "server.log").is_file() and "healthy" in r.stderr


def test_launch_refuses_a_url_that_already_answers(tmp_path: Path) -> None:
    with truth_server() as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(tmp_path / "r"), "--launch", "true")
    assert r.returncode == 1 and "already answers" in r.stderr and "Traceback" not in r.stderr


def test_a_launch_that_exits_is_one_line_and_exit_3(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    r = diagnose("readiness", "--url", url, "-o", str(tmp_path / "r"), "--launch", "sh -c 'echo boom; exit 4'")
    assert r.returncode == 3, r.stderr
    assert "exited with status 4" in r.stderr and "boom" in r.stderr and "Traceback" not in r.stderr


def _cold(first: float, warm: float, **extra: Any) -> dict[str, Any]:
    return {"healthy_s": 1.0, "first_token_s": 1.2, "first_ttft_ms": first, "cold_ttft_p50_ms": first,
            "warm_ttft_p50_ms": warm, "first_vs_warm_ratio": first / warm, "cold_vs_warm_ratio": first / warm,
            "failed_count": 0, **extra}


def test_the_cold_start_card() -> None:
    assert card.cold_start(None, THR, {})["status"] == "not run" and "--launch" in card.cold_start(None, THR, {})["summary"]
    assert card.cold_start(None, THR, {}, asked=False)["summary"] == card.NOT_ASKED
    assert card.cold_start(_cold(20, 10), THR, {})["status"] == "pass"
    c = card.cold_start(_cold(40, 10), THR, {})
    assert c["status"] == "fail" and "4.0x the warm TTFT (at most 3x)" in c["summary"] and c["fix"] == card.FIX_COLD
    assert card.cold_start(_cold(20, 10), THR, {"ttft_p99_ms": 15.0, "itl_p99_ms": 1.0})["status"] == "fail"
    failed = card.cold_start(_cold(20, 10, first_request_failed="http_5xx"), THR, {})
    assert failed["status"] == "fail" and "http_5xx" in failed["summary"]
    nothing = _cold(20, 10) | {"first_vs_warm_ratio": None, "failed_count": 12}
    assert card.cold_start(nothing, THR, {})["status"] == "not run"


def test_the_cancellation_card() -> None:
    ok = {"streams": 8, "aborted": 4, "kept": 4, "before": {"in_flight": 0}, "release_s": 0.2, "idle_s": 0.1,
          "kept_ok": 4, "kept_failed": [], "source": "slots"}
    assert card.cancellation(ok, THR)["status"] == "pass"
    slow = ok | {"release_s": 6.0}
    assert card.cancellation(slow, THR)["status"] == "fail"
    leak = ok | {"idle_s": None, "leaked": 2, "leaked_state": {"in_flight": 2, "busy_slots": [0, 3]}}
    c = card.cancellation(leak, THR)
    assert c["status"] == "fail" and "slots 0, 3 still busy" in c["summary"] and "last kept stream" in c["summary"]
    broke = ok | {"kept_failed": ["reset: connection reset"]}
    assert card.cancellation(broke, THR)["fix"] == card.FIX_KEPT
    assert card.cancellation({"not_run": "no state"}, THR)["status"] == "not run"
    stale = ok | {"idle_s": None, "stale_gauge": {"in_flight": 2}}
    assert card.cancellation(stale, THR)["status"] == "pass" and card.cancellation(stale, THR)["fix"] == card.FIX_STALE
    # a stale gauge after a release slower than the bound is still a fail
    assert card.cancellation(stale | {"release_s": 9.0}, THR)["status"] == "fail"


def test_the_page_escapes_what_it_shows(tmp_path: Path) -> None:
    doc = card.document("http://h:1", "serve <script>alert(1)</script>", {}, THR,
                        {"not_run": "<b>x</b>"}, None, {"model": "<i>m</i>", "engine": "unknown"})
    write(tmp_path, doc)
    html = (tmp_path / "readiness.html").read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>x</b>" not in html and "<i>m</i>" not in html and doc["verdict"] == "nothing checked"


@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "in-pieces"])
def test_the_engine_state_is_read_from_a_real_vllm_scrape(pieces: bool) -> None:
    """vLLM 0.32's /metrics as it really is (55 KB, the gauges 3.7 KB in; a client that kept only the first 2 KiB
    of a plain answer once found no gauge there), with requests running and waiting and the KV cache in use.
    in-pieces: the body arrives 1 KB at a time (a loaded server or network): one read of what had arrived
    once gave the start of the scrape without the gauges (the unit tier, on a busy machine)."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from diagnose.readiness.target import Target

    scrape = (Path(__file__).parent / "data" / "metrics" / "vllm_cpu_0.32_metrics_scrape.txt").read_text()
    scrape = (scrape.replace('vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0',
                             'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0')
              .replace('vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0',
                       'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2.0')
              .replace('vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0',
                       'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25'))
    assert scrape.index("vllm:num_requests_running{") > 2048

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body, status = {"/metrics": (scrape.encode(), 200),
                            "/v1/models": (b'{"data": [{"id": "tiny-llama"}]}', 200)}.get(self.path, (b"{}", 404))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            step = 1024 if pieces else len(body) or 1
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                self.wfile.flush()
                if pieces:
                    time.sleep(0.002)

        def log_message(self, *_a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        async def go() -> Any:
            t = Target(f"http://127.0.0.1:{srv.server_address[1]}")
            try:
                await t.connect()
                return t.source, t.engine, t.model, await t.state(0.0)
            finally:
                await t.close()

        source, engine, model, st = asyncio.run(go())
    finally:
        srv.shutdown()
        srv.server_close()
    assert (source, engine, model) == ("vllm_metrics", "vllm", "tiny-llama")
    assert st is not None and (st.in_flight, st.running, st.waiting, st.kv_usage) == (5, 3.0, 2.0, 0.25)


def _faults_overload(tmp_path: Path, *server: str) -> tuple[Any, dict[str, Any]]:
    """2 slots, 20 tokens 10 ms apart: 5 completions a second a slot, a server at capacity near 10 req/s."""
    out = tmp_path / "r"
    with fault_server("--tokens", "20", "--itl-ms", "10", "--slots", "2", *server) as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), *OVERLOAD)
    return r, _doc(out)


def test_an_unbounded_queue_fails_the_overload_check(tmp_path: Path) -> None:
    """Every request past the 2 slots waits, for as long as it takes (vLLM's and llama-server's queue): at 1.5x
    and 2x for 2 s each a backlog of ~30 requests builds, 3 s of work, where a request takes 0.2 s."""
    r, doc = _faults_overload(tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    m = doc["measurements"]["overload"]
    assert 4 <= m["capacity_rps"] <= 11, m["capacity"]  # 2 slots of 0.2 s requests
    assert [st["factor"] for st in m["steps"]] == [0.5, 1.0, 1.5, 2.0]
    assert all(st["sent"] + st["client_capped"] == st["planned"] for st in m["steps"])
    top = m["steps"][-1]
    assert top["rejected"] == 0 and top["errors"] == 0 and top["ok"] == top["sent"]
    # the queue: the server completes about its capacity while twice that arrives
    assert top["done_rps"] < 0.8 * top["rate_rps"]
    c = _check(doc, "RDY003")
    assert c["status"] == "fail" and c["summary"].startswith("unbounded queue: nothing was rejected")
    assert c["fix"] == card.FIX_UNBOUNDED and c["numbers"]["top_ttft_p99_ms"] > c["numbers"]["top_ttft_p99_limit_ms"]
    assert m["recovery_s"] is not None and m["recovery"]["probes"]  # the backlog drained, then latency came back
    assert doc["failed"] == ["RDY003"] and "RDY003 overload: FAIL" in r.stdout
    html = (tmp_path / "r" / "readiness.html").read_text()
    assert "RDY003 overload: step by step" in html and "completions meanwhile (req/s)" in html  # the step table
    assert "RDY003 overload: the numbers" not in html  # the key=value dump is in readiness.json, not the page


def test_a_queue_bounded_with_429_passes_the_overload_check(tmp_path: Path) -> None:
    """The same server with its queue bounded at 2 waiting (a gateway's limit): past that, 429 with a
    Retry-After at once; what it admits waits at most about two requests' time."""
    r, doc = _faults_overload(tmp_path, "--max-waiting", "2")
    assert r.returncode == 0, (r.stdout, r.stderr)
    m = doc["measurements"]["overload"]
    top = m["steps"][-1]
    assert top["rejected"] > 0 and top["rejected_with_retry_after"] == top["rejected"] and top["errors"] == 0
    assert top["outcomes"].get("rejected_429") == top["rejected"]
    c = _check(doc, "RDY003")
    assert c["status"] == "pass" and "it rejected" in c["summary"] and c["fix"] == ""
    assert c["numbers"]["top_ttft_p99_ms"] <= c["numbers"]["top_ttft_p99_limit_ms"]
    assert m["recovery_s"] is not None and m["recovery_s"] <= 10


def test_a_server_the_ramp_cannot_overload_is_not_judged(tmp_path: Path) -> None:
    """truth_server serves every request at once: 4 streams under-measure it, and 2x that it takes in its
    stride. Nothing was overloaded, so the check says so instead of passing."""
    out = tmp_path / "r"
    with truth_server(ttft_ms=5, itl_ms=10) as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), *OVERLOAD)
    assert r.returncode == 0, (r.stdout, r.stderr)
    c = _check(_doc(out), "RDY003")
    assert c["status"] == "not run" and c["summary"].startswith("not overloaded: at 2x the measured capacity")


def _over(**top: Any) -> dict[str, Any]:
    low = {"factor": 1.0, "rate_rps": 10.0, "sent": 20, "ok": 20, "rejected": 0, "rejected_with_retry_after": 0,
           "errors": 0, "client_capped": 0, "done_rps": 10.0, "ttft_p50_ms": 5.0, "ttft_p99_ms": 20.0,
           "e2e_p50_ms": 200.0, "error_examples": []}
    hi = low | {"factor": 2.0, "rate_rps": 20.0, "planned": 40, "sent": 40, "ok": 40, "done_rps": 10.0,
                "ttft_p99_ms": 300.0} | top
    return {"capacity_rps": 10.0, "baseline_ttft_p50_ms": 5.0, "steps": [low, hi], "recovery_s": 1.0,
            "client_capped": 0, "unfinished_at_drain": 0}


def test_the_overload_card() -> None:
    assert card.overload(None, THR, {})["status"] == "not run"
    assert card.overload({"not_run": "no capacity"}, THR, {})["summary"] == "no capacity"
    ok = card.overload(_over(), THR, {})  # 300 ms <= 20 + 2 x 200
    assert ok["status"] == "pass" and "no request was rejected" in ok["summary"]
    assert ok["numbers"]["top_ttft_p99_limit_ms"] == 420.0 and len(ok["rows"]) == 2
    assert card.overload(_over(ttft_p99_ms=500.0), THR, {})["fix"] == card.FIX_UNBOUNDED
    # an SLO's TTFT term replaces the relative limit
    slo = card.overload(_over(), THR, {"ttft_p99_ms": 250.0})
    assert slo["status"] == "fail" and "250 ms (the SLO's TTFT term)" in slo["summary"]
    err = card.overload(_over(errors=3, error_examples=["timeout: no bytes for 60 s"]), THR, {})
    assert err["status"] == "fail" and err["fix"] == card.FIX_ERRORS and "timeout: no bytes" in err["summary"]
    slow = card.overload(_over() | {"recovery_s": 30.0}, THR, {})
    assert slow["status"] == "fail" and slow["fix"] == card.FIX_RECOVERY and "at most 10 s" in slow["summary"]
    assert card.overload(_over() | {"recovery_s": None}, THR, {})["status"] == "fail"
    rej = card.overload(_over(rejected=10, rejected_with_retry_after=0, done_rps=10.0), THR, {})
    assert rej["status"] == "pass" and "Retry-After" in rej["fix"]
    # the client's cap on open requests met at the top step, nothing rejected: the cap bounded the wait, not
    # the server (a fast host: the card said "bounded" with 279 of 590 arrivals not sent)
    capped = card.overload(_over(client_capped=279, open_capped=279) | {"max_in_flight": 256}, THR, {})
    assert capped["status"] == "fail" and capped["fix"] == card.FIX_UNBOUNDED, capped
    assert capped["summary"].startswith("unbounded queue: nothing was rejected, and at 2x the measured capacity")
    assert "the client's cap of 256 open requests" in capped["summary"]
    # a server that rejected some while the client met its cap is judged by what it admitted, as before; so is
    # a step whose arrivals met only the cap on requests in all (the ramp's budget spent, nothing left to send)
    assert card.overload(_over(client_capped=5, open_capped=5, rejected=10, rejected_with_retry_after=10), THR,
                         {})["status"] == "pass"
    assert card.overload(_over(client_capped=10, open_capped=0), THR, {})["status"] == "pass"
    # a 1x step already behind its arrivals (a host that got busier after the capacity phase) queues: the limit
    # is made from the highest step at or below 1x that kept up (CI: 10.6 s "within" 12.2 s made from such a step)
    half = {"factor": 0.5, "rate_rps": 5.0, "sent": 10, "ok": 10, "rejected": 0, "rejected_with_retry_after": 0,
            "errors": 0, "client_capped": 0, "done_rps": 5.0, "ttft_p50_ms": 4.0, "ttft_p99_ms": 10.0,
            "e2e_p50_ms": 100.0, "error_examples": []}
    queued = _over(ttft_p99_ms=3000.0)
    queued["steps"][0] |= {"done_rps": 7.0, "ttft_p99_ms": 2500.0, "e2e_p50_ms": 600.0}
    queued["steps"].insert(0, half)
    late = card.overload(queued, THR, {})
    assert late["status"] == "fail" and late["numbers"]["top_ttft_p99_limit_ms"] == 210.0, late  # 10 + 2 x 100
    assert "the 0.5x step's TTFT P99" in late["summary"]
    assert card.overload(queued | {"steps": queued["steps"][1:]}, THR, {})["summary"].count(
        "a step already behind its arrivals") == 1  # no step kept up: the lowest, named as behind
    # the budget spent before the top step (most of its arrivals not sent for it): the check did not happen
    spent = card.overload(_over(client_capped=40, open_capped=0, sent=0, ok=0, ttft_p99_ms=None, e2e_p50_ms=None)
                          | {"max_requests": 2000}, THR, {})
    assert spent["status"] == "not run" and spent["summary"].startswith(
        "not overloaded: the ramp's budget of 2000 requests ran out before its top step was sent (at 2x"), spent


def test_a_crash_and_restart_is_timed_and_retries_stay_bounded(tmp_path: Path) -> None:
    """truth_server launched, 4 clients for 2 s, every process SIGKILLed, the same command started again: the
    requests in flight at the crash complete on a retry, nobody gives up, and the restarted server serves."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "r"
    r = diagnose("readiness", "--url", url, "-o", str(out), "--launch", _truth_cmd(port), "--checks", "failure",
                 "--failure-before", "2")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert not answers(url)  # the restarted server is stopped too
    doc = _doc(out)
    m = doc["measurements"]["failure"]
    assert m["in_flight_at_crash"] == 4 and m["completed_before"] > 0 and m["rps_before"] > 0
    assert m["outage_attempts"] > 0 and set(m["outage_failures"]) <= {"refused", "reset", "connect"}
    assert m["lost"] == 0 and m["lost_in_flight_at_crash"] == 0 and m["recovered_by_retry"] >= 4
    assert m["restart_healthy_s"] > 0 and m["recovery_s"] >= m["restart_healthy_s"]
    assert m["attempts_per_request_max"] <= 6 and m["completed_after"] > 0
    c = _check(doc, "RDY004")
    assert c["status"] == "pass" and c["summary"].startswith("serving again") and "retries bounded" in c["summary"]
    assert (out / "server.log").is_file() and (out / "server-restart.log").is_file()


def test_a_server_healthy_before_it_serves_fails_the_failure_check(tmp_path: Path) -> None:
    """faults.py restarted answers /health 200 at once but completions 503 for 3 s: a load balancer trusting
    /health would send it traffic it cannot serve. The probe's first token comes ~3 s after healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "r"
    cmd = (f"{sys.executable} {HERE / 'faults.py'} --port {port} --tokens 20 --itl-ms 5 --unready-s 3 "
           f"--state {tmp_path / 'started'}")
    r = diagnose("readiness", "--url", url, "-o", str(out), "--launch", cmd, "--checks", "failure",
                 "--failure-before", "1", "--threshold", "readiness_health_gap_max_s=1")
    assert r.returncode == 1, (r.stdout, r.stderr)
    m = _doc(out)["measurements"]["failure"]
    assert m["health_gap_s"] >= 2.5 and m["outage_failures"].get("http_5xx", 0) > 0
    c = _check(_doc(out), "RDY004")
    assert c["status"] == "fail" and c["summary"].startswith("healthy before ready") and c["fix"] == card.FIX_HEALTH


def _fail(**kw: Any) -> dict[str, Any]:
    return {"in_flight_at_crash": 4, "lost": 0, "lost_in_flight_at_crash": 0, "recovered_by_retry": 4,
            "restart_healthy_s": 1.0, "recovery_s": 1.5, "health_gap_s": 0.2, "outage_attempts": 10,
            "outage_attempts_per_s": 6.0, "rps_before": 10.0, "retry_amplification": 0.6, "max_retries": 5} | kw


def test_the_failure_card() -> None:
    assert "--launch" in card.failure(None, THR)["summary"] and card.failure(None, THR, asked=False)["summary"] == \
        card.NOT_ASKED
    assert card.failure(_fail(), THR)["status"] == "pass"
    down = card.failure(_fail(restart_failed="the server command exited with status 1", recovery_s=None), THR)
    assert down["status"] == "fail" and "exited with status 1" in down["summary"] and down["fix"] == card.FIX_DOWN
    assert card.failure(_fail(recovery_s=400.0), THR)["summary"].startswith("slow recovery")
    storm = card.failure(_fail(retry_amplification=7.5), THR)
    assert storm["status"] == "fail" and storm["fix"] == card.FIX_STORM and "7.5x" in storm["summary"]


SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "readiness_vllm_cpu"


def test_the_shipped_readiness_sample_is_what_the_card_makes_of_its_measurements() -> None:
    """The sample's card, judged again from its own measurements and thresholds by today's card, is the card it
    ships (a change to a judgement shows up here until the sample is captured again)."""
    doc = _doc(SAMPLE)
    m = doc["measurements"]
    again = card.document(doc["url"], doc["launch"], doc["slo"], doc["thresholds"], m["cancellation"],
                          m["cold_start"], doc["target"], m["overload"], asked=("cold-start", "failure"),
                          fail=m["failure"])
    assert again["checks"] == doc["checks"] and again["verdict"] == doc["verdict"]
    assert {c["id"]: c["status"] for c in doc["checks"]} == {"RDY001": "pass", "RDY002": "pass", "RDY003": "fail",
                                                            "RDY004": "pass"}
    assert doc["target"]["engine"] == "vllm"
    html = (SAMPLE / "readiness.html").read_text()
    assert "not ready: RDY003 overload" in html and html.count('<tr id="RDY00') == 4 and "<script" not in html


def test_the_ramp_never_has_more_requests_open_than_its_cap() -> None:
    """1,000 arrivals a second for a second, at most 4 open, against streams of 0.5 s: the loop sends overdue
    arrivals in bunches (sleeps shorter than its timer's grain), so a request must count as open from the moment
    it is sent, not when its task first runs. truth_server's own record of every request shows the overlap."""
    import asyncio
    import urllib.request

    from diagnose.readiness.overload import OverloadPlan
    from diagnose.readiness.overload import run as overload_run
    from diagnose.readiness.target import Target

    plan = OverloadPlan(factors=(1.0,), step_s=1.0, capacity_rps=1000.0, baseline=1, max_tokens=10,
                        max_in_flight=4, recovery_limit_s=5.0, drain_s=5.0)
    with truth_server(ttft_ms=5, itl_ms=50) as (url, _):
        async def go() -> Any:
            t = Target(url)
            try:
                await t.connect()
                await t.negotiate()
                return await overload_run(t, plan, 3.0)
            finally:
                await t.close()

        with urllib.request.urlopen(f"{url}/truth/reset", data=b"", timeout=5):
            pass
        m = asyncio.run(go())
        with urllib.request.urlopen(f"{url}/truth", timeout=5) as r:
            truth = json.loads(r.read())
    step = m["steps"][0]
    assert step["planned"] == 1000 and step["sent"] + step["client_capped"] == 1000 and step["client_capped"] > 900
    assert step["open_capped"] == step["client_capped"]  # the cap on open requests, not the budget, held them
    spans = [(x["arrival_ns"], x["arrival_ns"] + x["done_us"] * 1000) for x in truth["records"]
             if x["endpoint"] == "completions" and x["done_us"] is not None and x["max_tokens"] == 10]
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most, now = 0, 0
    for _, d in events:
        now += d
        most = max(most, now)
    assert 0 < most <= 4 + 1, (most, len(spans))  # + the one recovery probe, one at a time, after the ramp


def test_a_kept_streams_rate_needs_a_window_and_tokens_enough() -> None:
    """A fast host: the kept streams ended 1 ms after the abort, a few buffered chunks arriving at once, and the
    card read "330,687 tok/s each after the abort". A rate needs RATE_MIN_S and RATE_MIN_TOKENS."""
    from diagnose.probes.sse import StreamResult
    from diagnose.readiness.cancel import RATE_MIN_S, RATE_MIN_TOKENS, _rate

    t0 = 1_000_000_000
    burst = StreamResult(t_ns=[t0 + 100_000 * i for i in range(1, 6)], tok=[1] * 5)  # 5 tokens in 0.5 ms
    assert _rate(burst, t0, t0 + 1_000_000) is None  # 1 ms: no rate
    assert _rate(burst, t0, t0 + int(RATE_MIN_S * 1e9)) is None  # a long enough window, too few tokens
    steady = StreamResult(t_ns=[t0 + 50_000_000 * i for i in range(1, 11)], tok=[1] * 10)  # 10 tokens in 0.5 s
    assert RATE_MIN_TOKENS <= 10 and _rate(steady, t0, t0 + 500_000_000) == pytest.approx(20.0)


def test_streams_that_end_before_the_abort_are_run_again_with_more_tokens(tmp_path: Path) -> None:
    """25 tokens 20 ms apart end 0.5 s after the first, before the 1 s the streams run together: too few are
    open at the abort, so the check runs once more with 4x the tokens (2 s a stream) and judges that try; the
    first try's numbers are kept beside it."""
    out = tmp_path / "r"
    with truth_server(ttft_ms=5, itl_ms=20) as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), "--checks", "cancellation", "--cancel-streams", "4",
                     "--cancel-tokens", "25", "--cancel-dwell", "1")
    assert r.returncode == 0, (r.stdout, r.stderr)
    m = _doc(out)["measurements"]["cancellation"]
    assert m["first_try"]["max_tokens"] == 25 and m["max_tokens"] == 100
    assert m["first_try"]["too_soon"].startswith("0 of 4 streams still open 1 s after the last first token")
    assert all(s["ended"] and s["tokens"] == 25 for s in m["first_try"]["stream_times"])
    c = _check(_doc(out), "RDY001")
    assert (m["aborted"], m["kept"]) == (2, 2) and c["status"] == "pass", c
    assert c["summary"].endswith("; on a second try with 100 tokens a stream (the first, with 25: 0 of 4 streams "
                                 "still open 1 s after the last first token (3 wanted): the others had ended)")
    assert "once more with 100 tokens a stream" in r.stderr
    # every stream's times, from the check's start: sent, first token, end (none for an aborted stream)
    st = m["stream_times"]
    assert len(st) == 4 and all(0 <= s["sent_s"] <= s["first_token_s"] for s in st)
    assert sorted(s["end_s"] is None for s in st) == [False, False, True, True]
    assert all(s["first_token_s"] <= s["end_s"] for s in st if s["end_s"] is not None)


def test_streams_too_short_on_both_tries_leave_the_check_not_run_saying_why(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with truth_server(ttft_ms=5, itl_ms=10) as (url, _):
        r = diagnose("readiness", "--url", url, "-o", str(out), "--checks", "cancellation", "--cancel-streams", "4",
                     "--cancel-tokens", "8", "--cancel-dwell", "1")
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = _doc(out)
    m = doc["measurements"]["cancellation"]
    assert (m["first_try"]["max_tokens"], m["max_tokens"]) == (8, 32) and "aborted" not in m
    c = _check(doc, "RDY001")
    assert c["status"] == "not run", c
    assert c["summary"] == ("too few streams were still open after their first tokens to abort: 0 of 4 streams "
                            "still open 1 s after the last first token (3 wanted): the others had ended; raise "
                            "--cancel-tokens")


def test_an_earlier_run_is_judged_again_offline_with_other_thresholds(tmp_path: Path) -> None:
    """--from FOLDER: the shipped sample's measurements judged again, sending nothing. With nothing overridden
    the card is the one it ships; a tighter release bound (its vLLM release took 0.08 s) fails RDY001 with that
    number; the folder judged is never written into."""
    before = {p.name: p.read_bytes() for p in SAMPLE.iterdir()}
    out = tmp_path / "same"
    r = diagnose("readiness", "--from", str(SAMPLE), "-o", str(out))
    assert r.returncode == 1, (r.stdout, r.stderr)  # the sample's RDY003 fails
    again, doc = _doc(out), _doc(SAMPLE)
    assert again["checks"] == doc["checks"] and again["verdict"] == doc["verdict"]
    assert again["measurements"] == doc["measurements"] and again["thresholds"] == doc["thresholds"]
    tight = tmp_path / "tight"
    r = diagnose("readiness", "--from", str(SAMPLE / "readiness.json"), "-o", str(tight),
                 "--threshold", "readiness_cancel_release_max_s=0.05")
    assert r.returncode == 1
    c = _check(_doc(tight), "RDY001")
    assert c["status"] == "fail" and c["summary"].startswith(
        "slow release: the engine's in-flight work dropped in 0.08 s after the abort, past the bound of 0.05 s"), c
    assert _doc(tight)["thresholds"][card.RELEASE] == 0.05 and "RDY001 cancellation: FAIL" in r.stdout
    assert {p.name: p.read_bytes() for p in SAMPLE.iterdir()} == before


@pytest.mark.parametrize(("args", "needle"), [
    (("--url", "http://127.0.0.1:1", "--from", "X"), "not both"),
    ((), "--url is required"),
    (("--from", "MISSING"), "no such file"),
    (("--from", "NOTJSON"), "not valid JSON"),
    (("--from", "OTHER"), "not a readiness document"),
    (("--from", "FIFO"), "a FIFO"),
    (("--from", "SAMPLE", "--threshold", "nonsense_x=1"), "nonsense_x"),
    (("--from", "INSIDE"), "inside the readiness folder"),
])
def test_bad_from_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    import os

    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"schema_version": 1, "points": []}')
    os.mkfifo(tmp_path / "fifo.json")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "readiness.json").write_bytes((SAMPLE / "readiness.json").read_bytes())
    where = {"X": str(tmp_path), "MISSING": str(tmp_path / "nope"), "NOTJSON": str(tmp_path / "bad.json"),
             "OTHER": str(tmp_path / "other.json"), "FIFO": str(tmp_path / "fifo.json"), "SAMPLE": str(copy),
             "INSIDE": str(copy)}
    out = copy / "again" if "INSIDE" in args else tmp_path / "o"
    r = diagnose("readiness", *(where.get(a, a) for a in args), "-o", str(out))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
