"""Issue 35 item 3: a graph-capture pass is recognised whatever the framework (the stream-capture runtime calls,
SGLang and Inductor markers as well as vLLM's) and reported as a capture and nothing else; steps that capture
inside a serving trace are excluded, the serving steps kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from diagnose.pipeline import analyze
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from diagnose.trace import analyze_trace
from diagnose.trace.capture import capture_intervals
from tests.trace.helpers import DATA, write_trace
from tests.trace.synth import (
    inductor_capture_events,
    inductor_record_then_replay_events,
    sglang_capture_events,
)


def _findings(path: Path) -> dict[str, str]:
    a = analyze_trace(path)
    sig = {s.name: s for s in a.signals}
    res = evaluate([r for r in load_rules() if r.family == "trace"], sig, load_thresholds())
    return {f.rule_id: f.severity for f in res.findings}


def test_sglang_capture_pass(tmp_path: Path) -> None:
    """Old code: no finding ("no bottleneck", GPU busy 100% over 11 us of warm-up kernels)."""
    p = write_trace(tmp_path / "sglang.json", sglang_capture_events())
    a = analyze_trace(p)
    assert a.tables["trace_capture"]["rank"].tolist() == [0]
    assert {s.name: s.value for s in a.signals}["trace_gpu_kernels_count"] == 11
    assert _findings(p) == {"TRC009": "info"}


def test_inductor_cudagraph_trees_recording_pass(tmp_path: Path) -> None:
    """Old code: error TRC002 "GPU idle 88% of the trace, 100% of it waiting for the CPU" and TRC010."""
    p = write_trace(tmp_path / "inductor.json", inductor_capture_events())
    st = analyze_trace(p).tables["trace_steps"]
    assert len(st) == 3 and st["excluded"].str.startswith("graph capture").all()
    assert _findings(p) == {"TRC009": "info"}


def test_recording_steps_excluded_from_a_serving_trace(tmp_path: Path) -> None:
    a = analyze_trace(write_trace(tmp_path / "replay.json", inductor_record_then_replay_events()))
    st = a.tables["trace_steps"]
    assert st["excluded"].str.startswith("graph capture").tolist() == [True] * 3 + [False] * 5
    assert a.tables["trace_capture"].empty
    s = {x.name: x.value for x in a.signals}
    assert s["trace_steps_count"] == 5 and s["trace_steps_excluded_count"] == 3
    # the window: the 5 replay steps only, 10 x 10 us kernels back to back in each 1000 us step
    assert s["trace_gpu_busy_ratio"] == pytest.approx(500 / (4 * 1000 + 100))


def test_begin_capture_runs_to_its_end_capture() -> None:
    rt = pd.DataFrame({"name": ["hipStreamBeginCapture", "hipLaunchKernel", "hipStreamEndCapture",
                                "cudaStreamBeginCapture"],
                       "ts_us": [10.0, 20.0, 50.0, 100.0], "dur_us": [2.0, 3.0, 6.0, 1.0]})
    s, e = capture_intervals(pd.DataFrame(columns=["name", "ts_us", "dur_us"]), None, rt)
    assert s.tolist() == [10.0, 100.0] and e.tolist() == [56.0, 101.0]  # the second has no end: the call alone


def test_get_capture_info_alone_is_no_capture() -> None:
    """cudaStreamGetCaptureInfo is called while serving too (the shared SGLang decode trace has one)."""
    a = analyze_trace(DATA / "mi300x_sglang_qwen3_8b_decode.json.gz")
    assert a.tables["trace_capture"].empty and np.isfinite(a.tables["trace_steps"]["kernel_us"].iloc[0])


@pytest.mark.parametrize("events", [sglang_capture_events, inductor_capture_events], ids=["sglang", "inductor"])
def test_verdict_is_the_capture_not_no_bottleneck(tmp_path: Path, events: Any) -> None:
    """Old code: "No bottleneck found at warning level or above." (SGLang: busy 100% of its 11 us window)."""
    a = analyze(write_trace(tmp_path / "cap.json", events()))
    assert a.verdict is not None
    assert a.verdict.headline.startswith("Not judged: This is a graph-capture trace, not serving")
    assert a.verdict.top_rule == "TRC009"
