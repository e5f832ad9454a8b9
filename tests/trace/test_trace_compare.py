"""Issue 35: `diagnose compare TRACE_A TRACE_B` puts the whole-trace figures side by side: steps, step P50, GPU
busy, communication, peer wait and the host stall (beside the per-class GPU time it already had)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose import compare as cmp
from diagnose.cli.main import cli
from diagnose.pipeline import analyze
from tests.trace.helpers import write_trace
from tests.trace.synth import host_stall_events, write_nested_v1


def test_two_traces_side_by_side(tmp_path: Path) -> None:
    a_path = write_nested_v1(tmp_path / "a.json")  # 10 steps, busy 5460 / 10430 us
    b_path = write_trace(tmp_path / "b.json", host_stall_events())  # 6 steps, a 3 ms stall in each
    c = cmp.compare(analyze(a_path), analyze(b_path), resamples=200)
    rows = {t["what"]: t for t in c.trace}
    assert rows["steps counted"]["a"] == 10 and rows["steps counted"]["b"] == 6
    assert rows["GPU busy share of the window"]["a"] == pytest.approx(5460 / 10430, abs=1e-4)
    assert rows["host stall per step, P50"]["b"] == pytest.approx(3.0)
    assert rows["host stall share of step time"]["b"] == pytest.approx(18000 / 22500)
    r = CliRunner().invoke(cli, ["compare", str(a_path), str(b_path)])
    assert r.exit_code == 0 and "host stall per step, P50" in r.output, r.output
