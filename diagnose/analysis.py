"""The result of analysing one bundle (or trace): what reports render and what --json writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diagnose.model import Finding, NotEvaluated, Phase, ProbeStatus, Signal, Verdict, Window, level_phases

__all__ = ["Analysis", "Window"]


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
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    verdict: Verdict | None = None
    run_window: Window | None = None
    thresholds: dict[str, float] = field(default_factory=dict)  # those the rules judged by (with overrides)
    # the workload card (diagnose/signals/workload_card.py), computed once by the pipeline; None: no capture
    workload_card: dict[str, Any] | None = None
    # what the probes cost the server (diagnose/capture/overhead.py probe_cost), computed once by the pipeline
    # for the HTML and --json alike; None: the probes recorded no cost (older bundles, traces)
    probe_cost: dict[str, Any] | None = None

    @property
    def engine(self) -> str | None:
        """The engine the bundle names (target.engine), None when it names none."""
        target = self.manifest.get("target") if isinstance(self.manifest, dict) else None
        name = target.get("engine") if isinstance(target, dict) else None
        return name if isinstance(name, str) else None

    @property
    def run_valid(self) -> bool:
        return self.verdict is None or self.verdict.judged

    def verdict_window(self) -> tuple[dict[str, Signal], str]:
        """The signals the verdict's figures quote, and their label: the run's (label "") for one level; on a
        sweep never the pooled levels (issue 32) but the level the top finding was judged on (its rule is
        phase-scoped), else the highest level measured ("c=16")."""
        levels = level_phases(self.phases)
        if len(levels) <= 1:
            return self.signals, ""
        by_name = {p.name: ps for p, ps in zip(self.phases, self.phase_signals, strict=False)}
        top_rule = self.verdict.top_rule if self.verdict is not None else ""
        top = next((f for f in self.findings if f.rule_id == top_rule), None)
        label = next((e.window for e in (top.evidence if top else ()) if e.window != "run"), None)
        if label is None or label not in by_name:
            label = levels[-1].name
        return by_name.get(label, self.signals), label
