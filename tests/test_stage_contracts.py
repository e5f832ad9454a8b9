"""Issue 32 item 3, no side channels between the stages: the thresholds reach the table stage as an argument
(diagnose.normalize.TableContext), the normalisers' notes come back through it (not written into the Bundle),
and the analysis the pipeline returns is frozen (a later stage cannot rewrite it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from diagnose.io.bundle import open_bundle
from diagnose.normalize import TableContext, client
from diagnose.pipeline import analyze, analyze_opened
from tests.badinput import copy_sample, read_stream, write_stream
from tests.badinput_cases import BASE

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / BASE / "bundle"


def test_the_analysis_is_frozen(tmp_path: Path) -> None:
    a = analyze(SAMPLE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.findings = []  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.warnings = []  # type: ignore[misc]


def test_a_normaliser_returns_its_note_and_the_pipeline_reports_it(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    recs = read_stream(b, "requests")
    write_stream(b, "requests", recs + recs[2:4])
    ctx = TableContext.defaults()
    bundle = open_bundle(b)
    client.tables(bundle, ctx)
    assert any("2 duplicate request record(s)" in n for n in ctx.notes)
    assert not any("duplicate" in w for w in bundle.warnings)  # nothing written into the bundle
    opened = open_bundle(b)
    a = analyze_opened(opened)
    assert any("2 duplicate request record(s)" in w for w in a.warnings)
    assert not any("duplicate" in w for w in opened.warnings)
    assert not hasattr(opened, "thresholds")  # the old side channel (Bundle.thresholds) is gone


def test_the_thresholds_reach_the_table_stage_as_an_argument(tmp_path: Path) -> None:
    """The client-stall judgement (which requests a short stall of the load client touched) reads the thresholds
    it is given: a loop-lag bound above every sample marks no stall, one below the largest marks some."""
    bundle = open_bundle(SAMPLE)
    base = TableContext.defaults()
    lags = client.tables(bundle, base)["client_health"]["loop_lag_ms"]
    high = TableContext(thresholds={**base.thresholds, "client_loop_lag_max_ms": float(lags.max()) + 1})
    low = TableContext(thresholds={**base.thresholds, "client_loop_lag_max_ms": float(lags.max()) / 2})
    assert client.tables(open_bundle(SAMPLE), high)["client_stalls"].empty
    assert not client.tables(open_bundle(SAMPLE), low)["client_stalls"].empty
