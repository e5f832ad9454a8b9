"""The result of analysing one bundle (or trace): what reports render and what --json writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

from diagnose.model import Finding, NotEvaluated, Phase, ProbeStatus, Signal, Verdict, Window

__all__ = ["Analysis", "Section", "SectionKind", "Window"]

SectionKind = Literal["table", "stacked_bars", "flamegraph", "waterfall", "line_chart", "histogram", "text"]


@dataclass
class Section:
    """A report section contributed by a normaliser: plain data, rendered by reports/ by ``kind``.

    Payload shapes (all values plain JSON types; strings are escaped by the renderer):
      table:        {"columns": [str], "rows": [[cell, ...]], "note": str}
      stacked_bars: {"categories": [str], "series": [{"name": str, "values": [float]}], "unit": str,
                     "x_label": str, "y_label": str}
      flamegraph:   {"root": {"name": str, "value": float, "children": [...]}, "unit": str}
      waterfall:    {"rows": [{"label": str, "segments": [{"name": str, "start": float, "end": float}]}],
                     "unit": str}
      line_chart:   {"series": [{"name": str, "points": [[x, y], ...], "axis": "left"|"right"}],
                     "x_label": str, "y_label": str, "y2_label": str}
      histogram:    {"values": [float], "bins": int, "x_label": str, "unit": str}
      text:         {"text": str}
    """

    id: str
    title: str
    kind: SectionKind
    payload: dict[str, Any]
    group: str = "details"  # where it goes: "latency", "server", "host", "gpu", "trace", "details"
    order: int = 100


@dataclass
class Analysis:
    source: str  # bundle path or trace path
    manifest: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    signals: dict[str, Signal] = field(default_factory=dict)
    phase_signals: list[dict[str, Signal]] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    not_evaluated: list[NotEvaluated] = field(default_factory=list)
    probe_statuses: list[ProbeStatus] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    verdict: Verdict | None = None
    run_window: Window | None = None

    @property
    def run_valid(self) -> bool:
        return self.verdict is None or self.verdict.judged
