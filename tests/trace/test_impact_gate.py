"""Issue 35 item 2: a trace finding is a warning only when what it explains is a meaningful share of step or
trace time (``trc_finding_impact_min`` in rules/thresholds.yaml, the rule's ``minor_when``), else info."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.model import Signal
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from diagnose.trace import analyze_trace
from tests.trace.synth import write_nested_v1

WINDOW_US = 11470 - 1040  # synth.py: first kernel start to last kernel end


def _trace_findings(sig: dict[str, Signal]) -> dict[str, str]:
    res = evaluate([r for r in load_rules() if r.family == "trace"], sig, load_thresholds())
    return {f.rule_id: f.severity for f in res.findings}


def test_nine_pageable_copies_worth_0_09_percent_are_info(tmp_path: Path) -> None:
    a = analyze_trace(write_nested_v1(tmp_path / "v1.json", pageable=9))
    sig = {s.name: s for s in a.signals}
    assert sig["trace_async_pageable_copies_count"].value == 9
    assert sig["trace_async_pageable_copy_ratio"].value == pytest.approx(9 / WINDOW_US)  # 9 copies x 1 us
    assert _trace_findings(sig) == {"TRC004": "info"}  # old code: warning, leading the verdict


def _sig(name: str, value: float) -> Signal:
    return Signal(name=name, value=value, unit="", source="trace")


@pytest.mark.parametrize(("copy_ratio", "sync_ratio", "severity"), [
    (0.0001, 0.0, "info"), (0.019, 0.0, "info"), (0.06, 0.0, "warning"), (0.0001, 0.3, "warning")])
def test_pageable_copies_weighed_by_their_share(copy_ratio: float, sync_ratio: float, severity: str) -> None:
    sig = {s.name: s for s in (_sig("trace_async_pageable_copies_count", 12),
                               _sig("trace_async_pageable_copy_ratio", copy_ratio),
                               _sig("trace_sync_in_step_ratio", sync_ratio), _sig("trace_steps_count", 10),
                               _sig("trace_sync_blocking_steps_count", 10 if sync_ratio else 0))}
    assert _trace_findings(sig)["TRC004"] == severity


@pytest.mark.parametrize(("lag_share", "severity"), [(0.003, "info"), (0.135, "warning")])
def test_straggler_lag_weighed_by_the_step(lag_share: float, severity: str) -> None:
    sig = {s.name: s for s in (_sig("trace_straggler_last_share_ratio", 1.0), _sig("trace_straggler_lag_p50_us", 60),
                               _sig("trace_collectives_count", 400), _sig("trace_straggler_rank", 2),
                               _sig("trace_straggler_lag_step_ratio", lag_share))}
    assert _trace_findings(sig)["TRC008"] == severity
