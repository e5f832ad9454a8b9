"""The load probe against the real vLLM CPU server: a short closed-loop run at concurrency 4."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis import Window
from diagnose.capture.realtime import RealtimePriority
from diagnose.capture.workload import WorkloadSpec, build_phases
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import client as norm
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.load import LoadProbe

pytestmark = pytest.mark.engine


def _realtime() -> RealtimePriority:
    """The CPU engine saturates both cores of the test machine and starves the client's event loop, which
    then reads whole responses at once (every chunk one stamp: TPOT 0). As on a GPU server, where the client
    does not compete with the engine, run this thread's loop at a real-time priority while it measures
    (what attach --realtime does; normal priority where that is not permitted)."""
    return RealtimePriority()


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_short_run_records_are_sane(vllm_server: Any, tmp_path: Path, api: str) -> None:
    mode, phases = build_phases("4", None)
    spec = WorkloadSpec(mode=mode, phases=phases, duration_s=None, num_requests=12, warmup_requests=2,
                        input_tokens=64, output_tokens=24, api=api)  # type: ignore[arg-type]
    bw = BundleWriter(tmp_path / "b")
    ctx = CaptureContext(bundle=bw, target=Target(url=vllm_server.url), stop=asyncio.Event())
    with _realtime():
        status = asyncio.run(LoadProbe(spec, progress=False).run(ctx))
    bw.set_probe_status(status)
    bw.finish()
    assert status.state == "ok", status.reason
    assert status.detail["requests_ok"] == 14 and status.detail["requests_failed"] == 0
    opts = status.detail["request_options"]
    assert opts["ignore_eos"] is True and opts["stream_options"]["include_usage"] is True
    b = open_bundle(tmp_path / "b")
    recs = b.records("requests")
    assert len(recs) == 14
    for r in recs:
        assert r["ok"] and r["http_status"] == 200 and r["finish_reason"] == "length"
        assert r["first_token_ns"] > r["sent_ns"]  # TTFT > 0
        assert r["output_tokens_usage"] == 24  # max_tokens with ignore_eos
        if opts["stream_options"].get("continuous_usage_stats"):
            # exact tokens per content chunk; a last token that decodes to no text (random weights: a partial
            # UTF-8 sequence) ends the stream in a chunk with empty content, counted by usage only
            assert 22 <= r["output_tokens_chunks"] <= 24
        if api == "completions" and r["prompt_tokens_source"] == "tokenize":
            assert r["prompt_tokens_usage"] == 64  # exact prompt length via /tokenize
    tables = norm.tables(b)
    sig = {s.name: s.value for s in norm.signals(tables, Window(-math.inf, math.inf))}
    assert sig["requests_measured"] == 12 and sig["ttft_p50_ms"] > 0 and sig["output_tps"] > 0
    assert sig["tpot_p50_ms"] > 0 and sig["error_rate_ratio"] == 0
