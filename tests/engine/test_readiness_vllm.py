"""`diagnose readiness` on vLLM's CPU build, launched by diagnose (issue 37): the four checks on one server (the
failure check kills it and starts it again).

vLLM aborts a request when its HTTP connection closes, so RDY001 passes (its gauges read from /metrics, with
the KV cache's usage). With ``--max-num-seqs 4`` the engine runs at most 4 requests and queues the rest
without a limit: the overload ramp past the capacity a closed loop of 16 streams measured, up to 4x of it,
must find the unbounded queue (no 429/503, completions behind arrivals, and the admitted TTFT P99 past its
limit or the client's cap on open requests met). On a host whose engine ran 8x CI's (1,697 against 217 output
tok/s in the harness sanity check) the closed loop's measure of 16-token requests wandered from run to run,
the API server, the engine and the client sharing 2 cores: 37 req/s with 8 streams; 54, 29 and 20 with 16,
while the open loop's steps completed 45-73 a second. Where 2x of it kept up, the tool rightly said "not
overloaded: the capacity phase under-measured the server (raise --overload-concurrency ...)" and this test,
which asked for 2x at most, failed. Up to 4x: there at 20 req/s measured, the 4x step completed 44.5 a second
of 80 sent, admitted TTFT P99 2,750 ms against a limit of 402 ms. On CI's host the engine bounds the loop (the
4 slots) and 2x sufficed; 4x adds a larger backlog (about 16 s to drain at 15 req/s).
The cold start's numbers are asserted in their order, never against a time bound. After the crash the clients'
retries (5, backing off up to 4 s) give up long before a vLLM restart is healthy: requests are lost, and the
card says how many.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_inproc import diagnose
from tests.engine.test_compare_vllm import _launch_cmd
from tests.servers.truth import answers


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_readiness_on_vllm_cancellation_cold_start_and_an_unbounded_queue(engine_built: None, tmp_path: Path) -> None:
    cmd, url = _launch_cmd(["--max-num-seqs", "4"])
    out = tmp_path / "ready"
    r = diagnose("readiness", "--url", url, "-o", str(out), "--launch", cmd, "--startup-timeout", "400",
                 "--cancel-streams", "4", "--cancel-tokens", "400", "--cancel-dwell", "0.5",
                 "--overload-step", "4", "--overload-factors", "0.5,1,2,4", "--overload-capacity-time", "4",
                 "--overload-concurrency", "16", "--overload-tokens", "16", "--failure-before", "3")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert not answers(url), "the launched vLLM server is still answering"
    doc = json.loads((out / "readiness.json").read_text())
    assert doc["target"] == {"model": "tiny-llama", "engine": "vllm", "in_flight_source": "vllm_metrics"}
    checks = {c["id"]: c for c in doc["checks"]}
    cm = doc["measurements"]["cancellation"]
    assert checks["RDY001"]["status"] == "pass", (checks["RDY001"]["summary"], cm, r.stderr[-3000:])
    assert (cm["aborted"], cm["kept"]) == (2, 2) and cm["kept_failed"] == []
    assert cm["before"]["kv_usage"] is not None and cm["samples"][-1]["in_flight"] == 0
    cold = doc["measurements"]["cold_start"]
    assert 0 < cold["healthy_s"] <= cold["first_token_s"] and cold["failed_count"] == 0
    assert checks["RDY002"]["status"] in ("pass", "fail")
    m = doc["measurements"]["overload"]
    assert m["capacity_rps"] > 0 and all(st["rejected"] == 0 for st in m["steps"])
    top = m["steps"][-1]
    assert top["done_rps"] < 0.8 * top["rate_rps"], top
    c = checks["RDY003"]
    assert c["status"] == "fail" and c["summary"].startswith("unbounded queue: nothing was rejected"), c
    f = doc["measurements"]["failure"]
    assert f["in_flight_at_crash"] >= 1 and f["completed_before"] > 0
    assert 0 < f["restart_healthy_s"] <= f["recovery_s"] and f["completed_after"] > 0, f
    assert set(f["outage_failures"]) <= {"refused", "reset", "connect", "http_5xx"}, f
    assert f["lost"] > 0 and f["attempts_per_request_max"] <= 6  # bounded: 1 + 5 retries at most
    assert checks["RDY004"]["status"] == "pass", checks["RDY004"]
    assert (out / "server-restart.log").stat().st_size > 0
    assert "RDY003" in doc["failed"]
