"""The CLI end to end against a real streaming server, and every bad input: one line, right exit code.

Help, rules, analyze and the attach errors before connecting run in this process (tests/cli_inproc.py); the
captures stay real processes: a whole `diagnose attach` end to end, SIGINT/SIGTERM on a running capture, and the
target killed under one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnose.cli import exits
from diagnose.io.bundle import open_bundle
from tests.cli_inproc import Ran
from tests.cli_inproc import diagnose as run
from tests.servers.truth import free_port, truth_server

DIAG = [sys.executable, "-m", "diagnose"]


def one_line_error(p: subprocess.CompletedProcess[str] | Ran) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines, "expected an error message"
    assert lines[-1].startswith("diagnose: error:"), p.stderr
    return lines[-1]


def test_help_and_version() -> None:
    for args in (["--help"], ["attach", "--help"], ["analyze", "--help"], ["rules", "--help"],
                 ["rules", "explain", "--help"], ["run", "--help"]):
        p = run(*args)
        assert p.returncode == 0 and "Usage" in p.stdout, args
    p = run("--version")
    assert p.returncode == 0 and "diagnose" in p.stdout


def test_rules_commands() -> None:
    p = run("rules", "list")
    assert p.returncode == 0 and "SCH001" in p.stdout and "LAT001" in p.stdout
    p = run("rules", "explain", "sch001")
    assert p.returncode == 0 and "experiment:" in p.stdout and "max-num-seqs" in p.stdout
    # each threshold with its value (from rules/thresholds.yaml), the causes' conditions, and the links
    import yaml

    thr = yaml.safe_load((Path(__file__).parent.parent / "rules" / "thresholds.yaml").read_text())
    assert f"queue_depth_min = {thr['queue_depth_min']['value']} requests" in p.stdout
    assert "ruled out when:" in p.stdout and "Explains (" in p.stdout and "LAT001 high-ttft-normal-itl" in p.stdout
    p = run("rules", "explain", "LAT001")
    assert "Kind: symptom" in p.stdout and "Explained by" in p.stdout and "SCH001 queue-bound" in p.stdout
    assert "no rule" in one_line_error(run("rules", "explain", "NOPE999"))
    p = run("rules", "thresholds")
    assert p.returncode == 0 and "ttft_inflation_ratio" in p.stdout


def test_analyze_bad_inputs(tmp_path: Path) -> None:
    p = run("analyze", str(tmp_path / "missing"))
    assert p.returncode == 2 and "no such file" in one_line_error(p)
    (tmp_path / "empty").mkdir()
    p = run("analyze", str(tmp_path / "empty"))
    assert p.returncode == 2 and "not a capture bundle" in one_line_error(p)
    (tmp_path / "notes.txt").write_text("hello")
    p = run("analyze", str(tmp_path / "notes.txt"))
    assert p.returncode == 2 and "unknown input" in one_line_error(p)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"schema_version": 7}))
    p = run("analyze", str(bad))
    assert p.returncode == 2 and "unknown schema_version 7" in one_line_error(p)
    p = run("analyze", str(bad), "--threshold", "nonsense")
    assert p.returncode == 2 and "name=value" in one_line_error(p)


def test_attach_unreachable_and_refused(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    p = run("attach", "--url", f"http://127.0.0.1:{port}", "-c", "2", "-d", "2s", "-o", str(tmp_path / "b"))
    assert p.returncode == 3
    assert "connection refused" in one_line_error(p)
    assert not (tmp_path / "b").exists(), "no bundle for a capture that never started"
    p = run("attach", "--url", "ftp://x", "-o", str(tmp_path / "c"))
    assert p.returncode == 2 and "expected http" in one_line_error(p)
    p = run("attach", "--url", "http://127.0.0.1:1", "--slo", "ttft=5", "-o", str(tmp_path / "d"))
    assert p.returncode == 2 and "SLO" in one_line_error(p)


def test_attach_then_analyze_end_to_end(tmp_path: Path) -> None:
    with truth_server(ttft_ms=5, itl_ms=2) as (url, _):
        p = subprocess.run([*DIAG, "attach", "--url", url, "-c", "4", "-d", "3s", "--output-tokens", "16",
                            "--baseline", "4", "--slo", "ttft_p99=500ms,itl_p99=50ms", "--no-nvml",
                            "-o", str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    b = open_bundle(tmp_path / "b")
    assert not b.partial
    assert b.manifest["options"]["slo"] == {"ttft_p99_ms": 500.0, "itl_p99_ms": 50.0}
    reqs = b.records("requests")
    assert len(reqs) > 20 and all(r["ok"] for r in reqs)
    assert [p["role"] for p in b.records("phases")] == ["baseline", "measure"]
    assert "prompt_text" not in reqs[0] and "output_text" not in reqs[0]
    report = tmp_path / "r.html"
    p = run("analyze", str(tmp_path / "b"), "-o", str(report), "--json", str(tmp_path / "f.json"))
    assert p.returncode in (0, exits.INVALID_RUN), p.stderr  # which of the two: checked against run_valid below
    html = report.read_text()
    assert "<html" in html.lower() and "http://" not in html.replace(url, "")
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["signals"]["ttft_p50_ms"]["value"] > 4.0  # the server waits 5 ms before the first token
    assert data["signals"]["goodput_ratio"]["value"] > 0.9
    assert not [f for f in data["findings"] if f["severity"] in ("warning", "error", "critical")
                and f["family"] != "validity"]
    # on a loaded machine the client's own lag can make the run invalid: then the verdict must say so
    client_bound = any(f["rule_id"] == "VAL001" for f in data["findings"])
    assert data["run_valid"] is (not client_bound)
    assert data["verdict"].startswith("Run invalid") is client_bound
    assert p.returncode == (exits.INVALID_RUN if client_bound else 0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_capture_keeps_a_valid_partial_bundle(tmp_path: Path, sig: signal.Signals) -> None:
    with truth_server(ttft_ms=5, itl_ms=5) as (url, _):
        proc = subprocess.Popen([*DIAG, "attach", "--url", url, "-c", "4", "-d", "60s", "--output-tokens", "32",
                                 "--baseline", "0", "--no-nvml", "-o", str(tmp_path / "b")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        reqs = tmp_path / "b" / "requests.jsonl"
        while time.monotonic() < deadline and (not reqs.exists() or reqs.stat().st_size < 2000):
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    b = open_bundle(tmp_path / "b")
    assert b.partial and "interrupted" in b.manifest["capture"]["interrupted"]
    assert len(b.records("requests")) > 0
    p = run("analyze", str(tmp_path / "b"), "-o", str(tmp_path / "r.html"))
    invalid = "Run invalid" in p.stdout  # a loaded machine can starve the client: then the run is invalid
    assert p.returncode == (exits.INVALID_RUN if invalid else 0), p.stderr
    assert "Partial capture" in p.stdout


def test_target_dies_mid_capture(tmp_path: Path) -> None:
    with truth_server(ttft_ms=5, itl_ms=5) as (url, server):
        proc = subprocess.Popen([*DIAG, "attach", "--url", url, "-c", "4", "-d", "6s", "--output-tokens", "32",
                                 "--baseline", "0", "--no-nvml", "--timeout", "3s", "-o", str(tmp_path / "b")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        reqs = tmp_path / "b" / "requests.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not reqs.exists() or reqs.read_text().count('"ok":true') < 5):
            time.sleep(0.1)
        server.kill()
        out, err = proc.communicate(timeout=90)
    assert "Traceback" not in err
    b = open_bundle(tmp_path / "b")
    reqs = b.records("requests")
    assert any(r["ok"] for r in reqs), "requests finished before the server died are kept"
    assert any(not r["ok"] for r in reqs), "the failures after it died are recorded"
    p = run("analyze", str(tmp_path / "b"), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "f.json"))
    assert p.returncode in (0, exits.INVALID_RUN), p.stderr  # which of the two: checked against run_valid below
    data = json.loads((tmp_path / "f.json").read_text())
    assert p.returncode == (0 if data["run_valid"] else exits.INVALID_RUN)
    assert any(f["rule_id"] == "VAL003" for f in data["findings"])
