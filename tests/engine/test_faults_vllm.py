"""Issue 12 on the real vLLM CPU server (marker: engine): a server started with an API key, a capture with
py-spy on it stopped by SIGTERM part-way. The key reaches no file, py-spy samples vLLM's own processes (not
diagnose's), and the partial bundle is valid, analysable and keeps every finished request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from diagnose.cli import exits
from diagnose.io.bundle import open_bundle
from harness.engine import VllmServer

pytestmark = pytest.mark.engine
DIAG = [sys.executable, "-m", "diagnose"]
KEY = "sk-PLANTEDvllm0123456789abcdef"


def test_keyed_vllm_sigterm_mid_capture_no_key_on_disk_pyspy_on_vllm_only(
        start_vllm: Callable[..., VllmServer], tmp_path: Path) -> None:
    server = start_vllm(extra_args=["--api-key", KEY])
    assert server.pid is not None
    out = tmp_path / "b"
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    proc = subprocess.Popen([*DIAG, "attach", "--url", server.url, "--no-nvml", "--pyspy", "--pid", str(server.pid),
                             "-o", str(out), "-c", "2", "-d", "120s", "--baseline", "0", "--output-tokens", "16"],
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until some requests finished
        rq = out / "requests.jsonl"
        if rq.exists() and rq.read_bytes().count(b"\n") >= 6:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err
    assert proc.returncode == exits.INTERRUPTED, err[-2000:]
    b = open_bundle(out)
    assert b.partial and "SIGTERM" in (b.manifest["capture"]["interrupted"] or "")
    reqs = b.records("requests")
    assert sum(r["ok"] for r in reqs) >= 6 and b.manifest["streams"]["requests"]["records"] == len(reqs)
    # py-spy sampled vLLM's process tree and nothing of diagnose's
    tree = {server.pid, *(c.pid for c in psutil.Process(server.pid).children(recursive=True))}
    sampled = {r["pid"] for r in b.records("host_samples") if r.get("kind") == "process"}
    assert sampled and sampled <= tree, (sampled, tree)
    assert proc.pid not in sampled
    # the key: nowhere on disk or on stderr
    leaks = [str(f) for f in out.rglob("*") if f.is_file() and KEY.encode() in f.read_bytes()]
    assert leaks == [] and KEY not in err
    p = subprocess.run([*DIAG, "analyze", str(out), "-o", str(tmp_path / "r.html"), "--json",
                        str(tmp_path / "f.json")], capture_output=True, text=True, timeout=300)
    assert p.returncode in (exits.OK, exits.INVALID_RUN), p.stderr
    data: dict[str, Any] = json.loads((tmp_path / "f.json").read_text())
    assert data["verdict"].startswith("Partial capture")
    assert KEY not in (tmp_path / "f.json").read_text() + (tmp_path / "r.html").read_text()
