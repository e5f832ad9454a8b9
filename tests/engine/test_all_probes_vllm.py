"""Every probe at once against the real vLLM CPU engine (marker: engine): one `diagnose attach` with load,
Prometheus, the OTLP receiver, py-spy and the engine profiler must give one bundle holding all their
evidence, and `diagnose analyze` must turn it into a report with the per-request TTFT decomposition and the
note that requests overlapping the profiler window were left out of the statistics.

The server exports its spans over gRPC to the receiver's port and writes torch traces to the profiler dir.
The load client runs at real-time priority (--realtime): on the 2-core test machine the CPU engine would
otherwise starve it."""

from __future__ import annotations

import html
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from diagnose.analysis import Window
from diagnose.io.bundle import open_bundle
from diagnose.normalize import otel
from diagnose.normalize import prometheus as prom
from harness.engine import free_port
from tests.engine.test_pyspy_vllm import check_three_processes

pytestmark = pytest.mark.engine

DIAG = [sys.executable, "-m", "diagnose"]
ITERATIONS = 8
OUTPUT_TOKENS = 24


def test_every_probe_lands_in_one_bundle_and_report(start_vllm: Callable[..., object], tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    grpc_port, http_port = free_port(), free_port()
    server = start_vllm(profiler_dir=prof, otlp_traces_endpoint=f"http://127.0.0.1:{grpc_port}")
    out = tmp_path / "b"
    t0 = time.monotonic()
    p = subprocess.run(
        [*DIAG, "attach", "--url", server.url, "--no-nvml", "--realtime", "-o", str(out),  # type: ignore[attr-defined]
         "--baseline", "0", "--warmup", "1", "-c", "4", "-d", "12s", "--output-tokens", str(OUTPUT_TOKENS),
         "--otlp", "--otlp-grpc-port", str(grpc_port), "--otlp-http-port", str(http_port),
         "--pyspy", "--profile-iterations", str(ITERATIONS), "--profiler-dir", str(prof)],
        capture_output=True, text=True, timeout=240)
    attach_s = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    b = open_bundle(out)
    st = {s.name: s for s in b.probe_statuses()}
    assert {n: s.state for n, s in st.items()} == dict.fromkeys(
        ("load", "prometheus", "otel", "pyspy", "profiler"), "ok"), {n: (s.state, s.reason) for n, s in st.items()}
    assert b.manifest["options"]["realtime"]["requested"] is True

    # client requests
    reqs = [r for r in b.records("requests") if not r["warmup"]]
    ok = [r for r in reqs if r["ok"]]
    assert len(ok) >= 12 and len(ok) == len(reqs), [r.get("error") for r in reqs if not r["ok"]]

    # engine spans joined to the client requests by trace id
    log = Path(server.log_path).read_text(errors="replace").splitlines()  # type: ignore[attr-defined]
    exporter = [ln for ln in log if "export" in ln.lower() and "non-default args" not in ln][-12:]
    assert any(s["name"] == "llm_request" for s in b.records("spans")), (st["otel"].reason, st["otel"].detail, exporter)
    rb = otel.tables(b)["request_breakdown"]
    client = rb[rb["rid"].notna() & ~rb["warmup"].astype(bool) & rb["ok"].astype(bool)]
    assert client["matched"].mean() >= 0.9, f"{client['matched'].sum()} of {len(client)} joined"
    j = otel.joined(client)
    parts = j["client_network_ms"] + j["frontend_ms"] + j["queue_ms"] + j["prefill_ms"]
    assert np.allclose(parts, j["client_ttft_ms"])  # the decomposition adds up, request by request
    assert (j["client_network_ms"] > 0).all() and (j["prefill_ms"] > 0).all()

    # metric scrapes with vLLM's signals
    assert st["prometheus"].detail["scrapes_ok"] >= 5
    names = {s[0] for rec in b.records("metrics") for s in rec["samples"]}
    assert any(n.startswith("vllm:") for n in names), sorted(names)[:20]
    ps = {s.name: s.value for s in prom.signals(prom.tables(b), Window(-1e9, 1e9))}
    assert ps["running_requests_max"] >= 1 and 0 <= ps["kv_usage_max_ratio"] <= 1 and "queue_depth_max" in ps

    # py-spy stacks from the API server, EngineCore and the worker
    check_three_processes(out)

    # the worker's torch trace, and the profiler window
    traces = [a for a in b.manifest["artifacts"].values() if a["kind"] == "torch_trace"]
    worker = [a for a in traces if a["role"] == "worker"]
    assert len(worker) == 1 and worker[0]["iterations"] == ITERATIONS and worker[0]["bytes"] > 0
    d = st["profiler"].detail
    assert b.anchor_mono_ns < d["window_start_ns"] < d["window_end_ns"] <= d["stop_done_ns"]

    # the report: TTFT decomposition per request, and the profiler window left out of the statistics
    r = subprocess.run([*DIAG, "analyze", str(out), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "f.json")],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode in (0, 5), r.stderr[-2000:]  # 5: an invalid run (diagnose/cli/exits.py), report written
    data = json.loads((tmp_path / "f.json").read_text())
    assert r.returncode == (0 if data["run_valid"] else 5)
    sig = {k: v["value"] for k, v in data["signals"].items()}
    n_excluded = int(sig["requests_excluded_profiler"])
    assert n_excluded >= 1 and sig["profiler_window_s"] > 0
    # requests a short client stall touched are left out too (diagnose/normalize/client_stalls.py), and counted
    n_stalled = int(sig.get("requests_excluded_client_stall", 0))
    assert sig["requests_measured"] == len(ok) - n_excluded - n_stalled
    shares = [sig[f"ttft_{k}_share_ratio"] for k in ("queue", "prefill", "frontend", "client_network")]
    assert sum(shares) == pytest.approx(1.0, abs=0.02)
    page = html.unescape((tmp_path / "r.html").read_text())
    assert "TTFT decomposition by percentile" in page
    for part in ("queue", "prefill", "server frontend", "client+network"):
        assert part in page, part
    assert (f"{n_excluded} request{'s' if n_excluded != 1 else ''} overlapping the profiler window "
            f"({sig['profiler_window_s']:.1f} s) excluded from statistics") in page
    print(f"attach with every probe: {attach_s:.1f} s")
