"""`diagnose attach` + `diagnose analyze` against the real vLLM CPU engine (marker: engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from diagnose.io.bundle import open_bundle
from tests.engine.evidence import run_evidence

pytestmark = pytest.mark.engine

DIAG = [sys.executable, "-m", "diagnose"]


def _attach(url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """On this 2-core test machine the CPU engine saturates both cores and starves the load client (its
    event-loop lag reaches 20-50 ms, and VAL001 rightly declares the run invalid). As on a real GPU server,
    where the client does not compete with the engine for the CPU, the client runs at a real-time priority
    (--realtime; at normal priority, recorded in the bundle, where that is not permitted)."""
    return subprocess.run([*DIAG, "attach", "--url", url, "--no-nvml", "--realtime", "-o", str(out), *args],
                          capture_output=True, text=True, timeout=300)


def _analyze(bundle: Path, tmp: Path) -> dict:  # type: ignore[type-arg]
    p = subprocess.run([*DIAG, "analyze", str(bundle), "-o", str(tmp / "r.html"), "--json", str(tmp / "f.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 5), p.stderr  # 5: an invalid run (diagnose/cli/exits.py), report written
    html = (tmp / "r.html").read_text()
    assert "<script src=" not in html and "<link " not in html  # self-contained
    data = json.loads((tmp / "f.json").read_text())
    assert p.returncode == (0 if data["run_valid"] else 5)
    return data  # type: ignore[no-any-return]


def test_queue_bound_run_is_diagnosed_as_queueing(start_vllm: Callable[..., object], tmp_path: Path) -> None:
    server = start_vllm(extra_args=["--max-num-seqs", "2"])
    url = server.url  # type: ignore[attr-defined]
    load = ("--concurrency", "16", "--input-tokens", "128", "--output-tokens", "32")
    # one short pass of the same load first, not analysed: the first batches a fresh CPU engine sees run
    # slower than later ones (measured: ITL P50 10.5 ms on a fresh server, 6.6 ms on the next capture), and
    # the run judged here is a warm one, as tests/engine/test_compare_vllm.py and `diagnose experiment` do
    w = _attach(url, tmp_path / "warm", *load, "--duration", "5s", "--baseline", "0", "--warmup", "0")
    assert w.returncode == 0, w.stderr
    p = _attach(url, tmp_path / "b", *load, "--duration", "15s")
    assert p.returncode == 0, p.stderr
    b = open_bundle(tmp_path / "b")
    assert b.manifest["target"]["engine"] == "vllm"
    assert b.manifest["options"]["realtime"]["requested"] is True
    # the host counters (probes/host_cpu.py) run by default against a local server
    assert {s.name: s.state for s in b.probe_statuses()} == {"load": "ok", "prometheus": "ok", "host": "ok"}
    data = _analyze(tmp_path / "b", tmp_path)
    serious = [f for f in data["findings"] if f["severity"] != "info"]
    why = run_evidence(tmp_path / "b", data)
    assert serious and serious[0]["rule_id"] == "SCH001", why
    ev = {e["signal"]: e["value"] for e in serious[0]["evidence"]}
    assert ev["queue_depth_mean"] > 5, why  # 16 offered, 2 admitted: most wait
    assert ev["running_requests_max"] <= 2, why
    assert ev["server_queue_share_of_ttft_ratio"] > 0.5, why


def test_client_ttft_agrees_with_server_histogram(vllm_server: object, tmp_path: Path) -> None:
    url = vllm_server.url  # type: ignore[attr-defined]
    p = _attach(url, tmp_path / "b", "--concurrency", "4", "--duration", "10s", "--output-tokens", "32")
    assert p.returncode == 0, p.stderr
    data = _analyze(tmp_path / "b", tmp_path)
    sig = {k: v["value"] for k, v in data["signals"].items()}
    # the server histogram's P50 lies in a bucket; the client's P50 (which adds the network and HTTP
    # handling on loopback) must fall in that bucket or the next one up, never below it
    assert "server_ttft_p50_bucket_hi_ms" in sig, (sorted(k for k in sig if k.startswith("server_")),
                                                   data.get("warnings"), data.get("probes"), p.stderr[-1500:])
    lo, hi = sig["server_ttft_p50_bucket_lo_ms"], sig["server_ttft_p50_bucket_hi_ms"]
    assert lo <= sig["ttft_p50_ms"] <= hi * 2.5, (lo, sig["ttft_p50_ms"], hi)
    assert data["run_valid"] is True
