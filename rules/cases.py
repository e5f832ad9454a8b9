"""Rule test cases: a YAML file per rule with at least one "fires" and one "stays quiet" case.

Format (tests/rules/cases/<ID>.yaml for the built-in catalog, <DIR>/cases/<ID>.yaml for --rules DIR):

    rule: SCH001
    cases:
      - name: queue-bound run
        expect: fires            # fires | quiet | not_evaluated
        signals: {queue_depth_mean: 12, server_queue_share_of_ttft_ratio: 0.8}
        series: {queue_depth_mean: [[0, 10], [1, 12], [2, 14]]}   # optional (t_s, value) points
        phase_signals: [{...}, {...}]                             # optional, for phase-scope rules
        thresholds: {queue_depth_min: 2}                          # optional overrides
        causes: {"KV-cache capacity": ruled out}                   # optional: cause (by its first words) ->
                                                                  # supported | open | ruled out (when it fires)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from diagnose.model import Signal
from diagnose.rules.engine import EvaluationResult, evaluate
from diagnose.rules.spec import RuleSpec, load_thresholds
from diagnose.signals.catalog import SIGNALS

EXPECTS = ("fires", "quiet", "not_evaluated")


@dataclass
class Case:
    rule: str
    name: str
    expect: str
    signals: dict[str, float]
    series: dict[str, list[list[float]]] = field(default_factory=dict)
    phase_signals: list[dict[str, float]] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=dict)
    causes: dict[str, str] = field(default_factory=dict)
    severity: str = ""  # optional: the severity the finding must have when it fires (the impact gate)
    path: str = ""


def case_file_for(spec: RuleSpec, cases_dirs: list[Path]) -> Path | None:
    for d in cases_dirs:
        p = d / f"{spec.id}.yaml"
        if p.exists():
            return p
    user_cases = Path(spec.path).parent / "cases" / f"{spec.id}.yaml"
    return user_cases if user_cases.exists() else None


def load_cases(path: Path) -> list[Case]:
    raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or "rule" not in raw or not isinstance(raw.get("cases"), list):
        raise ValueError(f"{path}: a case file needs 'rule' and a list of 'cases'")
    out = []
    for i, c in enumerate(raw["cases"]):
        if not isinstance(c, dict) or c.get("expect") not in EXPECTS:
            raise ValueError(f"{path}: case #{i + 1} needs expect: fires | quiet | not_evaluated")
        out.append(Case(
            rule=str(raw["rule"]), name=str(c.get("name", f"case {i + 1}")), expect=str(c["expect"]),
            signals={str(k): float(v) for k, v in (c.get("signals") or {}).items()},
            series={str(k): v for k, v in (c.get("series") or {}).items()},
            phase_signals=[{str(k): float(v) for k, v in ps.items()} for ps in (c.get("phase_signals") or [])],
            thresholds={str(k): float(v) for k, v in (c.get("thresholds") or {}).items()},
            causes={str(k): str(v) for k, v in (c.get("causes") or {}).items()},
            severity=str(c.get("severity") or ""),
            path=str(path),
        ))
    return out


def _sig(name: str, value: float, series: list[list[float]] | None = None) -> Signal:
    return Signal(name=name, value=value, unit="", source="derived", description=SIGNALS.get(name, ""),
                  series=tuple((float(t), float(v)) for t, v in (series or [])))


def run_case(spec: RuleSpec, case: Case) -> str:
    """The outcome of one case: 'fires', 'quiet' or 'not_evaluated'."""
    return run_case_causes(spec, case)[0]


def run_case_causes(spec: RuleSpec, case: Case) -> tuple[str, dict[str, str]]:
    """The outcome of one case, and when it fires the status of each cause the case names."""
    sigs = {k: _sig(k, v, case.series.get(k)) for k, v in case.signals.items()}
    phases = [{k: _sig(k, v) for k, v in ps.items()} for ps in case.phase_signals]
    thr = load_thresholds(overrides=case.thresholds)
    res = evaluate([spec], sigs, thr, phases, [f"phase {i}" for i in range(len(phases))])
    fired = next((f for f in res.findings if f.rule_id == spec.id), None)
    if fired is not None:
        statuses = {name: next((c.status for c in fired.causes if c.cause.startswith(name)), "no such cause")
                    for name in case.causes}
        if case.severity and fired.severity != case.severity:
            return f"fires at {fired.severity}, not {case.severity}", statuses
        return "fires", statuses
    return _quiet_or_missing(spec, res), {}


def _quiet_or_missing(spec: RuleSpec, res: EvaluationResult) -> str:
    if any(n.rule_id == spec.id for n in res.not_evaluated):
        return "not_evaluated"
    return "quiet"
