"""The trace analysis on a trace captured just now from the real vLLM CPU engine (marker: engine).

A worker trace from /start_profile is CPU-only (vLLM's CPU build): the analysis must find the engine steps
with their prefill/decode split and token counts, the CPU ops, and say that there are no GPU events.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from diagnose.trace import analyze_trace

pytestmark = pytest.mark.engine


def _post(url: str, body: dict[str, object], timeout: float = 120.0) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
        return int(r.status)


def test_real_vllm_worker_trace(start_vllm: Callable[..., object], tmp_path: Path) -> None:
    prof = tmp_path / "prof"
    server = start_vllm(profiler_dir=prof, startup_timeout_s=560)  # the shared test machine can be slow
    url = server.url  # type: ignore[attr-defined]
    assert _post(f"{url}/start_profile", {"max_iterations": 40}) == 200

    def one(i: int) -> int:
        return _post(f"{url}/v1/completions", {"model": "tiny-llama", "prompt": f"request {i} " + "word " * (20 + i),
                                                "max_tokens": 12, "ignore_eos": True})

    with ThreadPoolExecutor(6) as ex:
        assert list(ex.map(one, range(6))) == [200] * 6
    _post(f"{url}/stop_profile", {}, timeout=120)
    deadline = time.monotonic() + 60
    worker: list[Path] = []
    while time.monotonic() < deadline and not worker:
        worker = [p for p in prof.rglob("*.pt.trace.json.gz") if "async_llm" not in p.name]
        time.sleep(0.5)
    assert worker, sorted(prof.rglob("*"))
    time.sleep(1.0)  # let the writer finish the file
    a = analyze_trace(worker[0])
    assert any("no GPU events" in w for w in a.warnings)
    sig = {s.name: s.value for s in a.signals}
    assert sig["trace_steps_count"] >= 5
    assert sig["trace_step_prefill_count"] + sig["trace_step_mixed_count"] >= 1
    assert sig["trace_step_decode_count"] >= 1
    steps = a.tables["trace_steps"]
    assert (steps["source"] == "vllm").all() and (steps["dur_us"] > 0).all()
    assert steps["prefill_tokens"].max() >= 20
    assert any(str(n).startswith("aten::") for n in a.tables["trace_cpu_ops"]["name"])
