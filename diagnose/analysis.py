"""The result of analysing one bundle (or trace): what reports render and what --json writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from diagnose.io.manifest import Manifest, read_manifest
from diagnose.model import Finding, NotEvaluated, Phase, ProbeStatus, Signal, Verdict, Window, level_phases
from diagnose.signals.sweep import SweepMarks

__all__ = ["Analysis", "Window"]


@dataclass(frozen=True)
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
    # a sweep's knee and max-goodput level (diagnose/signals/sweep.py), judged once by the pipeline; None: one level
    sweep: SweepMarks | None = None
    # what the input holds: "serving", "trace", "fleet" or "spans" (pipeline._input_kind), decided once for the
    # "not evaluated" list and the page alike; an Analysis made by hand is a serving capture
    input_kind: str = "serving"
    # the engine's settings the capture read, each by the engine's own flag where known
    # (diagnose/engines/experiments.py named_settings), named once by the pipeline for the page
    engine_settings: list[tuple[str, float]] = field(default_factory=list)

    @cached_property
    def meta(self) -> Manifest:
        """The manifest, typed (diagnose/io/manifest.py): what every stage after the reader reads. ``manifest``
        keeps the decoded dict for --json and the report's Environment section."""
        return read_manifest(self.manifest or {}, f"{self.source}/manifest.json")

    @property
    def engine(self) -> str | None:
        """The engine the bundle names (target.engine), None when it names none."""
        return self.meta.target.engine

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
