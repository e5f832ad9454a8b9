"""Inline-SVG chart builders and the data helpers behind them (binning, downsampling, pruning, redaction)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from diagnose.reports import charts
from diagnose.reports.render import fmt_value
from diagnose.reports.sections_view import bin_values, flatten, prune_tree, redact_value

EVIL = "<script>alert(1)</script>&\"'"


def test_nice_ticks_cover_range() -> None:
    t = charts.nice_ticks(0, 87)
    assert t[0] == 0 and t[-1] >= 87 and len(t) <= 8
    steps = {round(b - a, 9) for a, b in zip(t, t[1:], strict=False)}
    assert steps == {20.0}
    assert charts.nice_ticks(5, 5)[-1] > 5  # degenerate range still gives an axis


def test_downsample_keeps_extremes_and_bound() -> None:
    x = np.arange(10_000, dtype=float)
    y = np.sin(x / 50)
    y[7777] = 42.0
    y[333] = -42.0
    out = charts.downsample(np.column_stack([x, y]).tolist(), 200)
    assert len(out) <= 200
    ys = [p[1] for p in out]
    assert max(ys) == 42.0 and min(ys) == -42.0
    assert [p[0] for p in out] == sorted(p[0] for p in out)
    assert charts.downsample([[1, float("nan")], [2, 3]], 10) == [(2.0, 3.0)]


def test_bin_values_linear_and_log() -> None:
    lin = bin_values(np.linspace(10, 20, 1000), bins=10)
    assert not lin["log_x"] and sum(b[2] for b in lin["bins"]) == 1000 and len(lin["bins"]) == 10
    assert lin["markers"][0]["label"] == "P50" and lin["markers"][0]["x"] == pytest.approx(15, rel=0.01)
    wide = bin_values(np.concatenate([np.full(900, 1.0), np.geomspace(1, 1000, 100)]))
    assert wide["log_x"] and wide["bins"][0][0] == 1.0 and wide["bins"][-1][1] == 1000.0
    assert bin_values([float("nan")])["n"] == 0


def test_prune_tree_folds_small_frames() -> None:
    root = {"name": "root", "value": 1000.0, "children": [
        {"name": "big", "value": 990.0, "children": [{"name": "leaf", "value": 500.0}]},
        {"name": "tiny", "value": 0.5}]}
    tree, dropped = prune_tree(root, min_frac=0.001)
    assert [c["name"] for c in tree["children"]] == ["big"] and dropped == 1
    assert tree["value"] == 1000.0  # the folded time stays in the parent
    wide = {"name": "r", "value": 10_000.0, "children": [{"name": f"f{i}", "value": 1.0} for i in range(10_000)]}
    small, dropped = prune_tree(wide, max_nodes=100)
    assert len(small.get("children", [])) <= 100 and dropped >= 9_900


def test_flamegraph_escapes_and_truncates() -> None:
    root = {"name": "all", "value": 100.0, "children": [{"name": EVIL * 20, "value": 60.0},
                                                         {"name": "b", "value": 1.0}]}
    svg = charts.flamegraph(root, title="Flame " + EVIL, unit="samples")
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert "…" in svg  # a long name is cut to its box width in the visible label
    assert svg.count("<rect") == 3
    assert "60.0%" in svg  # the tooltip states the share


def test_line_chart_escapes_labels_and_has_axes() -> None:
    svg = charts.line_chart([{"name": EVIL, "points": [[0, 1], [1, 2]]},
                             {"name": "q", "axis": "right", "points": [[0, 5], [1, 0]], "style": "step"}],
                            title=EVIL, x_label="time (s)", y_label="TTFT (ms)", y2_label="queued (requests)",
                            bands=[{"start": 0, "end": 0.5, "label": EVIL}, {"start": 0.5, "end": 1, "label": "b"}])
    assert "<script>" not in svg
    for label in ("time (s)", "TTFT (ms)", "queued (requests)"):
        assert f">{label}</text>" in svg
    assert "(right axis)" in svg
    assert "http" not in svg  # no xmlns URL or any other reference


def test_line_chart_without_points_says_no_data() -> None:
    svg = charts.line_chart([{"name": "a", "points": []}], title="t", x_label="x", y_label="y")
    assert ">no data</text>" in svg


def test_histogram_markers_and_cdf() -> None:
    b = bin_values(np.arange(1, 101, dtype=float), bins=10)
    svg = charts.histogram(b["bins"], title="h", x_label="v (ms)", markers=b["markers"])
    assert svg.count('class="bar"') == 10
    assert 'class="cdf"' in svg and "P99 99" in svg


def test_stacked_bars_and_waterfall_wrap_long_legends() -> None:
    series = [{"name": f"series number {i} with a long name", "values": [1.0, 2.0]} for i in range(8)]
    svg = charts.stacked_bars(["P50", "P99"], series, title="t", unit="ms", x_label="time", y_label="pct")
    ys = {float(m) for m in re.findall(r'<text class="legend" x="[\d.]+" y="([\d.]+)"', svg)}
    assert len(ys) > 1  # legend wrapped onto several rows instead of running off the chart
    assert ">time (ms)</text>" in svg
    wf = charts.waterfall([{"label": EVIL, "segments": [{"name": "queue", "start": 0, "end": 5}]}],
                          title="w", unit="ms")
    assert "<script>" not in wf and ">time (ms)</text>" in wf


def test_fmt_value() -> None:
    assert fmt_value(None) == "—" and fmt_value(float("nan")) == "—"
    # a share shows as the rule titles show it: whole percents from 10% up (93% in both), a decimal below
    assert fmt_value(0.1234, "ratio") == "12%" and fmt_value(0.9336, "ratio") == "93%"
    assert fmt_value(0.0914, "ratio") == "9.1%" and fmt_value(0.0025, "ratio") == "0.25%"
    assert fmt_value(98765.4) == "98,765"
    assert fmt_value(3.14159) == "3.14" and fmt_value(0.0123) == "0.012"
    # never scientific notation: a float's residue (1.39e-17 as a share) and tiny means are bounded, not 1e-15
    assert fmt_value(1.39e-17, "ratio") == "<0.001%" and fmt_value(9.3e-05) == "<0.001"
    assert fmt_value(-9.3e-05) == ">-0.001" and fmt_value(0.0) == "0" and fmt_value(0.00123) == "0.0012"
    assert fmt_value(1300.4) == "1,300" and charts.fmt_num(0.00004) == "<0.001" and charts.fmt_num(0.0012) == "0.0012"


def test_redaction() -> None:
    assert redact_value("api_key", "abc") == "[redacted]"
    assert redact_value("Authorization", "x") == "[redacted]"
    assert redact_value("output_tokens", 64) == 64
    assert redact_value("max_tokens", 64) == 64
    assert redact_value("note", "use Bearer abc.def now") == "use [redacted] now"
    assert redact_value("cmd", "--api-key sk-abcdefghijkl") == "--api-key [redacted]"
    rows = flatten({"target": {"headers": {"X": "1"}, "url": "http://h"}, "hf_token": "hf_abcdefghijk"})
    assert rows == [["hf_token", "[redacted]"], ["target.headers", "[redacted]"], ["target.url", "http://h"]]


def test_flatten_compacts_lists_and_sizes() -> None:
    rows = dict(flatten({"phases": [{"index": 0, "rate": None, "name": "c=1"}], "memory_total_bytes": 25276514304,
                         "extra": {}}))
    assert rows == {"phases[0]": "index=0, name=c=1", "memory_total_bytes": "23.5 GiB", "extra": "—"}


def test_band_labels_only_where_they_fit() -> None:
    bands = [{"start": i, "end": i + 1, "label": f"rate={i}/s"} for i in range(40)]
    svg = charts.line_chart([{"name": "a", "points": [[0, 1], [40, 2]]}], title="t", x_label="x", y_label="y",
                            bands=bands)
    assert 'class="band-label"' not in svg and svg.count("<title>rate=") == 40
    wide = charts.line_chart([{"name": "a", "points": [[0, 1], [2, 2]]}], title="t", x_label="x", y_label="y",
                             bands=bands[:2])
    assert wide.count('class="band-label"') == 2
