"""Issue 11: vLLM V1 steps from annotation / NVTX ranges, besides the execute_model Python frames. vLLM wraps
each step's phases in record_function_or_nullcontext("gpu_model_runner: preprocess" / "forward" /
"postprocess" / "sample") (vllm/v1/worker/gpu_model_runner.py): torch.profiler user annotations with
VLLM_CUSTOM_SCOPES_FOR_PROFILING=1, NVTX ranges with VLLM_NVTX_SCOPES_FOR_PROFILING=1 (category "nvtx" once
nsys exports them to a Chrome trace). The synthetic traces below have that shape: one eager prefill step,
then decode steps of one graph replay each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections.trace import sections
from diagnose.trace import analyze_trace
from tests.trace.helpers import step_gpu_work, write_trace


def _range(name: str, ts: float, dur: float, cat: str) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur}


def _scoped_trace(tmp_path: Path, cat: str = "user_annotation", *, explicit: bool = False,
                  cut_first: bool = False) -> Path:
    """8 steps: step 0 an eager prefill of 200 kernels (30 µs), steps 1-7 one graph replay of 100 kernels
    (18 µs). Each step: preprocess 300 µs, forward (the launches), postprocess 50 µs, sample 80 µs.
    ``explicit``: an ``execute_model`` range around each step as well. ``cut_first``: the trace starts inside a
    step (a forward and a sample scope before the first preprocess)."""
    evs: list[dict[str, Any]] = []
    corr = 0
    t = 1000.0
    if cut_first:
        evs += [_range("gpu_model_runner: forward", 10, 400, cat), _range("gpu_model_runner: sample", 420, 80, cat)]
    for step in range(8):
        start = t
        evs.append(_range("gpu_model_runner: preprocess", t, 300, cat))
        t += 310
        f0 = t
        work, t, corr = step_gpu_work(t, corr, eager=200 if step == 0 else 0)
        evs += work
        evs.append(_range("gpu_model_runner: forward", f0, t - f0, cat))
        t += 5
        evs.append(_range("gpu_model_runner: postprocess", t, 50, cat))
        t += 55
        evs.append(_range("gpu_model_runner: sample", t, 80, cat))
        t += 80
        if explicit:
            evs.append(_range("execute_model", start, t - start, cat))
        t += 150
    return write_trace(tmp_path / f"v1_scopes_{cat}.json", evs)


def _check_steps(path: Path) -> None:
    a = analyze_trace(path)
    st = a.tables["trace_steps"]
    assert len(st) == 8 and (st["source"] == "vllm_v1_range").all()
    assert st["step_type"].tolist() == ["prefill"] + ["decode"] * 7
    # CPU duration from preprocess start to sample end; GPU duration from the step's kernels
    assert st["dur_us"].iloc[0] == pytest.approx(310 + 200 * 30 + 5 + 55 + 80)
    assert st["dur_us"].iloc[1:].tolist() == pytest.approx([310 + 1925 + 5 + 55 + 80] * 7)
    assert st["gpu_dur_us"].iloc[1:].tolist() == pytest.approx([99 * 19 + 18] * 7)
    assert st["graph_replays"].iloc[1:].tolist() == [1] * 7 and st["eager_kernels"].iloc[0] == 200
    sig = {s.name: s.value for s in a.signals}
    assert sig["trace_step_prefill_count"] == 1 and sig["trace_step_decode_count"] == 7
    lead = fmt_text(next(s for s in sections(a.tables) if s.id == "trace_steps_lead").payload.text)
    assert "8 steps (7 decode, 1 prefill; from vLLM V1 execute_model ranges (annotation / NVTX)" in lead


def test_runner_scopes_as_user_annotations(tmp_path: Path) -> None:
    _check_steps(_scoped_trace(tmp_path))


def test_runner_scopes_as_nvtx_ranges(tmp_path: Path) -> None:
    path = _scoped_trace(tmp_path, "nvtx")
    _check_steps(path)
    assert not [w for w in analyze_trace(path).warnings if "unknown event categories" in w]


def test_explicit_execute_model_ranges(tmp_path: Path) -> None:
    _check_steps(_scoped_trace(tmp_path, "NVTX", explicit=True))


def test_scopes_before_the_first_preprocess_are_no_step(tmp_path: Path) -> None:
    _check_steps(_scoped_trace(tmp_path, cut_first=True))


def _as_begin_end(path: Path, *, drop_end_cat: bool = True) -> Path:
    """The same trace with every annotation range written as an NVTX push / pop would be: a "B" event and an
    "E" event, in time order per thread (outer ranges open first, inner ones close first), the "E" without
    category or name when ``drop_end_cat`` (both are optional in the Chrome trace format)."""
    import json

    evs = json.loads(path.read_text())["traceEvents"]
    ranges = [e for e in evs if e.get("cat") in ("nvtx", "NVTX", "user_annotation")]
    rest = [e for e in evs if e not in ranges]
    marks = []
    for r in ranges:
        b = {k: v for k, v in r.items() if k != "dur"} | {"ph": "B"}
        e = {"ph": "E", "ts": r["ts"] + r["dur"], "pid": r["pid"], "tid": r["tid"]}
        if not drop_end_cat:
            e |= {"cat": r["cat"], "name": r["name"]}
        marks += [((r["ts"], 1, -r["dur"]), b), ((r["ts"] + r["dur"], 0, r["dur"]), e)]
    marks.sort(key=lambda m: m[0])  # at one time: ends before begins, inner ends first, outer begins first
    out = path.with_name(path.stem + "_begin_end.json")
    return write_trace(out, [m for _, m in marks] + rest)


@pytest.mark.parametrize("drop_end_cat", [True, False], ids=["bare-end", "end-with-category"])
def test_runner_scopes_as_nvtx_begin_end_pairs(tmp_path: Path, drop_end_cat: bool) -> None:
    """NVTX push / pop ranges as Chrome "B" / "E" pairs (nested: an execute_model range around each step's
    scopes) give the same steps as complete ("X") ranges, with no event dropped."""
    path = _as_begin_end(_scoped_trace(tmp_path, "nvtx", explicit=True), drop_end_cat=drop_end_cat)
    assert '"ph": "B"' in path.read_text() or '"ph":"B"' in path.read_text()
    _check_steps(path)
    assert analyze_trace(path).warnings == analyze_trace(_scoped_trace(tmp_path, "nvtx", explicit=True)).warnings


def test_unpaired_begin_end_events_are_counted_and_ignored(tmp_path: Path) -> None:
    path = _as_begin_end(_scoped_trace(tmp_path, "nvtx"))
    import json

    evs = json.loads(path.read_text())["traceEvents"]
    evs.append({"ph": "B", "cat": "nvtx", "name": "never closed", "ts": 1e9, "pid": 100, "tid": 100})
    evs.append({"ph": "E", "cat": "nvtx", "name": "opened elsewhere", "ts": 5.0, "pid": 100, "tid": 999})
    a = analyze_trace(write_trace(tmp_path / "unpaired.json", evs))
    assert "unpaired.json: 2 annotation begin/end events without their pair were ignored" in a.warnings
    assert len(a.tables["trace_steps"]) == 8  # the paired ranges still give the steps
