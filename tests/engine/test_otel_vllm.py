"""OTLP receiver + trace-id join against the real vLLM CPU engine (marker: engine).

The engine is started first with ``--otlp-traces-endpoint`` pointing at a port where nothing listens yet,
as a user would; ``diagnose attach --otlp`` then opens the receiver there and must get every request's
``llm_request`` span, joined to the client request by the trace id of its ``traceparent`` header.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from diagnose.analysis import Window
from diagnose.io.bundle import open_bundle
from diagnose.normalize import otel
from diagnose.reports.sections.otel import sections as otel_sections
from harness.engine import free_port

pytestmark = pytest.mark.engine

OUTPUT_TOKENS = 24


def attach(url: str, out: Path, *args: str, concurrency: int = 4) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnose",
            "attach",
            "--url",
            url,
            "--no-nvml",
            "--realtime",  # the CPU engine on the 2-core test machine would starve the client (see test_attach_vllm)
            "-o",
            str(out),
            "--baseline",
            "0",
            "-c",
            str(concurrency),
            "-d",
            "6s",
            "--output-tokens",
            str(OUTPUT_TOKENS),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def check_join(bundle_dir: Path) -> dict[str, float]:
    """Every successful request joined, and each decomposition physically sane; returns the signals."""
    b = open_bundle(bundle_dir)
    st = {s.name: s for s in b.probe_statuses()}
    assert st["otel"].state == "ok", st["otel"]
    assert st["otel"].detail["requests_expected"] > 10
    assert st["otel"].detail["requests_with_spans"] == st["otel"].detail["requests_expected"]
    spans = [s for s in b.records("spans") if s["name"] == "llm_request"]
    assert spans and all(s["kind"] == "SERVER" for s in spans)
    t = otel.tables(b)
    rb = t["request_breakdown"]
    j = otel.joined(rb[~rb["warmup"]])
    assert len(j) >= 10
    assert (j["completion_tokens"] == OUTPUT_TOKENS).all()
    # the client sees its first token after the server produced it, and sends before the server's arrival stamp
    assert (j["client_network_ms"] > 0).all(), j["client_network_ms"].min()
    assert (j["pre_server_ms"] > -1.0).all() and (j["pre_server_ms"] < 1000).all()
    assert (j["e2e_client_network_ms"] > 0).all()
    assert (j["queue_ms"] >= 0).all() and (j["prefill_ms"] > 0).all() and (j["decode_ms"] > 0).all()
    assert (j["frontend_ms"] > 0).all()
    parts = j["client_network_ms"] + j["frontend_ms"] + j["queue_ms"] + j["prefill_ms"]
    assert np.allclose(parts, j["client_ttft_ms"])
    sig = {s.name: s.value for s in otel.signals(t, Window(-1e12, 1e12))}
    assert sig["join_matched_ratio"] == 1.0
    shares = [
        sig[k]
        for k in (
            "ttft_queue_share_ratio",
            "ttft_prefill_share_ratio",
            "ttft_frontend_share_ratio",
            "ttft_client_network_share_ratio",
        )
    ]
    assert sum(shares) == pytest.approx(1.0, abs=0.02)
    secs = {s.id for s in otel_sections(t)}
    assert {"otel_ttft_decomposition", "otel_ttft_shares", "otel_slowest_waterfall"} <= secs
    return sig


def test_grpc_spans_join_every_request(start_vllm: Callable[..., object], tmp_path: Path) -> None:
    grpc_port, http_port = free_port(), free_port()
    server = start_vllm(otlp_traces_endpoint=f"http://127.0.0.1:{grpc_port}")
    p = attach(
        server.url,  # type: ignore[attr-defined]
        tmp_path / "b",
        "--otlp",
        "--otlp-grpc-port",
        str(grpc_port),
        "--otlp-http-port",
        str(http_port),
    )
    assert p.returncode == 0, p.stderr[-2000:]
    sig = check_join(tmp_path / "b")
    detail = {s.name: s for s in open_bundle(tmp_path / "b").probe_statuses()}["otel"].detail
    assert detail["exports"]["grpc"] > 0 and detail["exports"]["http"] == 0
    assert detail["rejected"] == {"grpc": 0, "http": 0}
    assert sig["span_prefill_time_p99_ms"] > 0
    # 4 in flight, default batch cap: nothing waits in the scheduler's queue (the quiet case)
    assert sig["ttft_queue_share_ratio"] < 0.2


def test_queue_bound_ttft_is_mostly_queue(start_vllm: Callable[..., object], tmp_path: Path) -> None:
    """--max-num-seqs 2 at 16 in flight: the join puts most of each request's TTFT in the queue."""
    grpc_port, http_port = free_port(), free_port()
    server = start_vllm(otlp_traces_endpoint=f"http://127.0.0.1:{grpc_port}", extra_args=["--max-num-seqs", "2"])
    p = attach(server.url, tmp_path / "b", "--otlp", "--otlp-grpc-port", str(grpc_port),  # type: ignore[attr-defined]
               "--otlp-http-port", str(http_port), concurrency=16)
    assert p.returncode == 0, p.stderr[-2000:]
    sig = check_join(tmp_path / "b")
    assert sig["ttft_queue_share_ratio"] > 0.5, sig
    assert sig["ttft_queue_share_ratio"] > 3 * sig["ttft_prefill_share_ratio"]
    assert sig["span_queue_time_p50_ms"] > sig["span_prefill_time_p50_ms"]
