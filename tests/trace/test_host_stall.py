"""Issue 35 item 5: a recurring host stall inside the steps is located (the CPU frame open when it begins,
whether the trace recorded any CPU op inside it) and the finding names the right next probe; full CUDA graphs are
ruled out as its fix when an eager step shows the stall too. The figures are counted from the events of
tests/trace/synth.py (host_stall_events)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from diagnose.trace import analyze_trace
from tests.trace.helpers import write_trace
from tests.trace.synth import FORWARD_FRAME, RUNNER_FRAME, STALL_US, host_stall_events


@pytest.mark.parametrize("include_python", [False, True])
def test_stall_located_in_every_step(tmp_path: Path, include_python: bool) -> None:
    a = analyze_trace(write_trace(tmp_path / "stall.json", host_stall_events()), include_python=include_python)
    hs = a.tables["trace_host_stalls"]
    assert hs["step"].tolist() == list(range(6))
    assert hs["stall_us"].tolist() == [STALL_US] * 6  # the copy kernel ends at +55, the forward launches at +55+S
    assert hs["offset_us"].tolist() == [55.0] * 6
    assert (hs["cpu_ops_inside"] == 0).all() and hs["untraced"].all()
    # without Python stacks the innermost kept frame is the runner's execute_model; with them, _model_forward
    assert set(hs["frame"]) == {FORWARD_FRAME if include_python else RUNNER_FRAME}
    s = {x.name: x.value for x in a.signals}
    assert s["trace_host_stall_p50_ms"] == pytest.approx(STALL_US / 1e3)
    # 6 stalls over the steps' CPU time: prefill 3000 + 2500, decodes 3000 + 400 each
    assert s["trace_host_stall_step_ratio"] == pytest.approx(6 * STALL_US / (5500 + 5 * 3400))
    assert s["trace_host_stall_eager_steps_count"] == 1 and s["trace_host_stall_untraced_ratio"] == 1.0


def test_finding_names_the_native_probe_and_rules_out_full_graphs(tmp_path: Path) -> None:
    """Old code: no finding at all (11 idle gaps, under the 20 the idle rules need), and no host-stall table."""
    a = analyze_trace(write_trace(tmp_path / "stall.json", host_stall_events()))
    res = evaluate([r for r in load_rules() if r.family == "trace"], {s.name: s for s in a.signals},
                   load_thresholds())
    f = next(f for f in res.findings if f.rule_id == "TRC011")
    assert f.severity == "warning" and RUNNER_FRAME in f.hypothesis
    status = {c.cause.split(" (")[0]: c for c in f.causes}
    native = status["untraced host work in the stall"]
    assert native.status == "supported" and native.experiment is not None
    assert "py-spy record --native" in native.experiment.change and "nsys" in native.experiment.change
    assert status["per-kernel launch work between graph pieces that full CUDA graphs would remove"].status == \
        "ruled out"


def test_a_recorded_op_inside_the_stall_is_traced(tmp_path: Path) -> None:
    evs = host_stall_events()
    evs.append({"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 851, "tid": 851, "ts": 1000 + 1000,
                "dur": 50})  # inside step 0's stall (1055 to 4055)
    hs = analyze_trace(write_trace(tmp_path / "stall.json", evs)).tables["trace_host_stalls"]
    assert hs["cpu_ops_inside"].tolist() == [1, 0, 0, 0, 0, 0]
