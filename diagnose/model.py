"""Central types shared by probes, the pipeline, rules and reports.

Plain frozen dataclasses; nothing here imports probes, rules or reports.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ProbeState = Literal["ok", "unavailable", "failed", "running", "skipped"]


@dataclass(frozen=True)
class ProbeStatus:
    """What became of one probe: ok, unavailable (could not run here), failed (broke), with the reason."""

    name: str
    state: ProbeState
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProbeStatus:
        return cls(
            name=str(d.get("name", "?")),
            state=d.get("state", "failed"),
            reason=str(d.get("reason", "")),
            detail=dict(d.get("detail") or {}),
        )


Source = Literal["client", "server", "host", "gpu", "trace", "derived"]


@dataclass(frozen=True)
class Signal:
    """A named, unit-carrying derived value with provenance.

    ``value`` is the run-level value; ``series`` (optional) holds (t_s, value) points over the capture
    (t_s seconds from the capture start) so rules can require a condition to *hold*. A missing signal is
    absent from the signal set: never stored as zero.
    """

    name: str
    value: float
    unit: str
    source: Source
    description: str = ""
    series: tuple[tuple[float, float], ...] = ()

    def is_finite(self) -> bool:
        return isinstance(self.value, (int, float)) and math.isfinite(self.value)


@dataclass(frozen=True)
class Experiment:
    """The one change to try, and which signal should move which way if the hypothesis is right."""

    change: str
    expect: tuple[tuple[str, str], ...] = ()  # (signal name, "down" | "up" | "flat")


@dataclass(frozen=True)
class Cause:
    """A candidate cause of a finding, how to confirm or refute it, and the experiment that tests it."""

    cause: str
    confirm: str = ""
    refute: str = ""
    experiment: Experiment | None = None


@dataclass(frozen=True)
class Evidence:
    signal: str
    value: float
    unit: str
    source: str
    note: str = ""


Severity = Literal["info", "warning", "error", "critical"]
SEVERITY_WEIGHT: dict[str, float] = {"info": 1.0, "warning": 2.0, "error": 3.0, "critical": 4.0}


@dataclass(frozen=True)
class Finding:
    rule_id: str
    name: str
    family: str
    severity: Severity
    title: str
    hypothesis: str
    confidence: float
    impact: float
    score: float
    evidence: tuple[Evidence, ...] = ()
    causes: tuple[Cause, ...] = ()
    sources: tuple[str, ...] = ()
    runbook: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NotEvaluated:
    rule_id: str
    name: str
    missing: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
