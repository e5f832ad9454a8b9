"""The labelled trace suite (issue 11): every trace under /work/shared/traces (the small ones copied to
tests/data/traces), and the synthetic traces of tests/trace/synth.py (label key ``synthetic``: the builder's name;
they reproduce real serving shapes the shared traces lack), against its hand-written expectation in
tests/trace/labels/: steps and kinds, graph mode,
GPU busy share, the exact set of trace findings (none for the GPU-bound ones), each with its reasons, and the cause
that explains the GPU-idle symptom (TRC010), if any."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from diagnose.trace import analyze_trace
from tests.trace.helpers import DATA
from tests.trace.synth import SYNTHETIC

LABELS = Path(__file__).resolve().parent / "labels"
SHARED = Path("/work/shared/traces")


def _labels() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) | {"label": p.name} for p in sorted(LABELS.glob("*.yaml"))]


def _path(label: dict[str, Any], tmp: Path) -> Path | None:
    if label.get("synthetic"):
        return SYNTHETIC[label["synthetic"]](tmp)
    if label.get("copy"):
        return DATA / label["copy"]
    p = SHARED / label["trace"]
    return p if p.exists() else None


@pytest.mark.parametrize("label", _labels(), ids=lambda lb: lb["label"])
def test_labelled_trace(label: dict[str, Any], tmp_path: Path) -> None:
    path = _path(label, tmp_path)
    if path is None:
        assert not SHARED.is_dir(), f"{label['trace']} is missing from {SHARED}"
        pytest.skip(f"{SHARED} is not on this machine and {label['trace']} is too large to copy")
    a = analyze_trace(path)
    st = a.tables["trace_steps"]
    assert len(st) == label["steps"]
    kinds = st["step_type"].value_counts().items() if len(st) else []
    assert {str(k): int(v) for k, v in kinds} == label["step_kinds"]
    # profiler artefacts: which steps are excluded (warm-up, profiler start / stop), none unless labelled
    excluded = [str(e).split(":")[0] for e in st["excluded"] if e] if len(st) else []
    assert excluded == label.get("excluded", [])
    gm = a.tables["trace_graph_mode"]
    assert (gm["mode"].tolist() or ["none"]) == [label["graph_mode"]]
    sig = {s.name: s for s in a.signals}
    if label["busy_ratio"] is None:
        assert "trace_gpu_busy_ratio" not in sig
    else:
        lo, hi = label["busy_ratio"]
        assert lo <= sig["trace_gpu_busy_ratio"].value <= hi
    res = evaluate([r for r in load_rules() if r.family == "trace"], sig, load_thresholds())
    assert sorted(f.rule_id for f in res.findings) == sorted(label["findings"]), label["why"]
    # the symptom (TRC010, GPU idle) is explained by the cause labelled for it, or by none (then the report says so)
    idle = next((f for f in res.findings if f.rule_id == "TRC010"), None)
    assert (idle.explained_by or None if idle else None) == label["idle_explained_by"], label["why"]
    for f in res.findings:  # the reasons are shown: evidence with values, and a sample size in the title
        assert f.hypothesis and f.evidence and "unknown" not in f.title.replace("unknown steps", ""), f.title


def test_every_shared_trace_is_labelled() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not on this machine")
    traces = {p.relative_to(SHARED).as_posix() for p in SHARED.glob("*/*.json*") if "expected" not in p.name}
    assert traces == {lb["trace"] for lb in _labels() if not lb.get("synthetic")}
