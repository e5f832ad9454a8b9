"""One value per quantity per page: every number the report shows for a signal in a window (run, a level, the
baseline) has one value, wherever it appears (headline tiles, percentile and sweep tables, finding evidence);
and a sweep's headline is per level, never pooled."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from diagnose.pipeline import analyze
from diagnose.reports.view_model import build_view

SAMPLES = sorted(p for p in (Path(__file__).parent.parent / "sample_traces").iterdir() if (p / "bundle").is_dir())


def quantities(view: dict[str, Any]) -> dict[tuple[str, str], set[float]]:
    """(signal, window label) -> the values shown for it anywhere in the view."""
    seen: dict[tuple[str, str], set[float]] = defaultdict(set)

    def add(signal: str, window: str, value: Any) -> None:
        if signal and isinstance(value, (int, float)):
            seen[(signal, window)].add(float(f"{value:.6g}"))

    verdict = view["verdict"]
    for k in verdict["key_numbers"]:
        add(k["signal"], k["window"], k["value"])
    for lv in verdict["by_level"]:
        for k in lv["key_numbers"]:
            add(k["signal"], k["window"], k["value"])
    for w in view["percentiles"]["windows"]:
        label = w["label"].removesuffix(" (reference)")
        for r in w["rows"]:
            for p, v in r["values"].items():
                add(f"{r['key']}_{p}_ms", label, v)
        for t in w["throughput"]:
            add(t["signal"], label, t["value"])
    sweep = view["percentiles"]["sweep"]
    for row in (sweep or {}).get("rows", []):
        for c in row["cells"]:
            add(c["signal"], row["label"], c["value"])
    for f in view["findings"]:
        for x in (f, *f["also_seen"]):  # a card, and the findings folded into it
            for e in x["evidence"]:
                add(e["signal"], e["window"], e["value"])
    return seen


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.name for p in SAMPLES])
def test_no_quantity_shows_two_values_in_one_window(sample: Path) -> None:
    view = build_view(analyze(sample))
    q = quantities(view)
    assert q, "the walker found no quantity: the view changed shape"
    clashes = {k: v for k, v in q.items() if len(v) > 1}
    assert not clashes, f"{sample.name}: one quantity, several values: {clashes}"


def test_the_walker_catches_a_clash() -> None:
    view = build_view(analyze(SAMPLES[0]))
    k = next(iter(view["findings"][0]["evidence"])) if view["findings"] else None
    if k is None:
        pytest.skip("first sample has no finding")
    view["verdict"]["key_numbers"].append({"signal": k["signal"], "window": k["window"], "value": k["value"] + 1})
    assert any(len(v) > 1 for v in quantities(view).values())


def test_sweep_headline_is_per_level() -> None:
    sweeps = []
    for s in SAMPLES:
        a = analyze(s)
        if sum(1 for p in a.phases if not p.is_baseline) > 1:
            sweeps.append((s, a))
    assert sweeps, "no sweep sample: the per-level headline is untested"
    for s, a in sweeps:
        v = build_view(a)["verdict"]
        assert v["key_numbers"] == [], f"{s.name}: pooled headline numbers"
        assert [lv["label"] for lv in v["by_level"]] == [p.name for p in a.phases if not p.is_baseline]
        assert build_view(a)["percentiles"]["sweep"] is not None
