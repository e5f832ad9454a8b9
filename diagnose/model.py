"""Central types shared by probes, the pipeline, rules and reports.

Plain frozen dataclasses; nothing here imports probes, rules or reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
    # the one variable it changes (diagnose/engines/experiments.py): kind (engine_flag | env | client | deployment),
    # name (an engine flag's neutral name, spelt per engine by diagnose.engines.experiments.ENGINE_FLAGS), and the
    # suggested value computed from this bundle's signals ('' when none is suggested or computable)
    variable_kind: str = ""
    variable: str = ""
    value: str = ""


CauseStatus = Literal["supported", "open", "ruled out"]


@dataclass(frozen=True)
class Cause:
    """A candidate cause of a finding, how to confirm or refute it, and the experiment that tests it.

    ``status``: "ruled out" when its refuting evidence is in the bundle, "supported" when its confirming
    evidence is, else "open"; ``status_evidence`` names the values that decided it."""

    cause: str
    confirm: str = ""
    refute: str = ""
    experiment: Experiment | None = None
    status: CauseStatus = "open"
    status_evidence: str = ""


@dataclass(frozen=True)
class Evidence:
    signal: str
    value: float
    unit: str
    source: str
    note: str = ""
    window: str = "run"  # which window the value is of: "run" or a phase's label (phase-scoped rules)


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
    kind: str = "cause"  # "cause" | "symptom" (restates what is out of line; ranked after every cause)
    explained_by: str = ""  # the rule id of the fired cause that explains this one (its `explains:` names it)
    share: float | None = None  # the share of the symptom this cause explains (its rule's `share:` signal)
    share_of: str = ""  # the signal ``share`` is (its definition says what the share is of)
    held_back: str = ""  # the rule id of the validity finding that holds this one back (its evidence is suspect)
    # how well the evidence fits: confidence x the fit of its best candidate cause (supported 1, open 0.8, all
    # ruled out 0.5); score = severity weight x fit x the share it explains (the impact estimate where none is known)
    fit: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NotEvaluated:
    rule_id: str
    name: str
    missing: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- windows and phases ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """A stretch of the capture that signals are computed over (t_s = seconds since the clock anchor)."""

    start_s: float
    end_s: float
    phase: int | None = None  # None: the whole measured window
    label: str = "run"
    exclude_phases: tuple[int, ...] = ()  # phases never in this window's statistics (the baseline)


PhaseRole = Literal["baseline", "measure"]


def _num(v: Any) -> float | None:
    """A finite int/float (never a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


@dataclass(frozen=True)
class Phase:
    """One load phase of a capture (the ``phases`` stream): a baseline or a measured level of the workload.

    ``start_s``/``end_s`` are seconds since the clock anchor (``end_s`` is inf when the phase never ended).
    """

    phase: int
    name: str
    role: PhaseRole
    start_s: float
    end_s: float
    mode: str = ""  # as the load wrote it: "concurrency" (closed loop), "rate" (open loop), "replay", ...
    concurrency: float | None = None
    rate: float | None = None
    arrival: str = ""
    interrupted: bool = False
    repeat: int = 1  # which run of its level (``--repeat``): 1, 2, ...

    @property
    def level_key(self) -> tuple[str, float | None]:
        """What repeats of one level share: its kind and offered load (a phase without a level: its name)."""
        if self.level is not None:
            return (self.level_kind, self.level)
        return (self.level_name, None)

    @property
    def level_name(self) -> str:
        """The phase's name without its repeat's suffix (``c=8 r2`` -> ``c=8``)."""
        return self.name.removesuffix(f" r{self.repeat}")

    @property
    def is_baseline(self) -> bool:
        return self.role == "baseline"

    @property
    def level(self) -> float | None:
        """The offered load: concurrency for a closed loop, rate (req/s) for an open loop."""
        return self.concurrency if self.concurrency is not None else self.rate

    @property
    def level_kind(self) -> str:
        """"concurrency" or "rate": two levels are comparable only when their kinds match."""
        return "concurrency" if self.concurrency is not None else ("rate" if self.rate is not None else "")

    def window(self) -> Window:
        return Window(self.start_s, self.end_s, self.phase, self.name)

    @classmethod
    def from_record(cls, rec: Mapping[str, object], anchor_mono_ns: int) -> Phase | None:
        """The phase a ``phases`` record describes; None when the record is unusable (no integer start)."""
        start = rec.get("start_ns")
        if isinstance(start, bool) or not isinstance(start, int):
            return None
        end = rec.get("end_ns")
        end_s = (end - anchor_mono_ns) / 1e9 if isinstance(end, int) and not isinstance(end, bool) else math.inf
        idx = rec.get("phase", 0)
        idx = int(idx) if isinstance(idx, int) and not isinstance(idx, bool) else 0
        role: PhaseRole = "baseline" if rec.get("role") == "baseline" else "measure"
        conc, rate = _num(rec.get("concurrency")), _num(rec.get("rate"))
        return cls(phase=idx, name=str(rec.get("name") or f"phase {idx}"), role=role,
                   start_s=(start - anchor_mono_ns) / 1e9, end_s=end_s, mode=str(rec.get("mode") or ""),
                   concurrency=conc if conc is not None and conc > 0 else None,
                   rate=rate if rate is not None and rate > 0 else None,
                   arrival=str(rec.get("arrival") or ""), interrupted=bool(rec.get("interrupted")),
                   repeat=_repeat(rec.get("repeat")))


def _repeat(v: Any) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1


def level_phases(phases: Sequence[Phase]) -> list[Phase]:
    """The measured phases, one per level: a level run several times (``--repeat``) by its first run, so a
    sweep's per-level judgements see each level once (the run's own signals pool all of its repeats)."""
    seen: set[tuple[str, float | None]] = set()
    out: list[Phase] = []
    for p in sorted((p for p in phases if not p.is_baseline), key=lambda p: (p.repeat, p.phase)):
        if p.level_key not in seen:
            seen.add(p.level_key)
            out.append(p)
    return sorted(out, key=lambda p: p.phase)


# -- the verdict -------------------------------------------------------------------------------------------
VerdictLevel = Literal["ok", "info", "warning", "error", "critical", "invalid"]


@dataclass(frozen=True)
class Verdict:
    """The one verdict of an analysis, written by the judgement stage; reports only show it.

    ``judged`` is False when the run is invalid: nothing measured on it is presented as a result.
    """

    level: VerdictLevel
    headline: str
    detail: str = ""
    judged: bool = True
    partial: bool = False
    top_rule: str | None = None
    # the top cause finding's best-supported candidate cause, what would refute it, the one experiment, and
    # the share of the symptom it explains (empty when the verdict names no cause)
    cause: str = ""
    cause_status: str = ""
    cause_evidence: str = ""
    refute: str = ""
    experiment: str = ""
    share: float | None = None
    share_of: str = ""  # the signal the share is: what it is a share of, in its catalogue definition
    explains: tuple[str, ...] = ()  # the fired findings shown as its consequences
    symptom: str = ""  # what is out of line and by how much: the title of the strongest symptom finding

    @property
    def text(self) -> str:
        """The verdict as one paragraph (CLI, --json)."""
        return self.headline + (f" {self.detail}" if self.detail else "")
