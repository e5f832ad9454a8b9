"""Scoring a scenario run: its top findings against the expected one; confusion table and accuracy.

Top-1 follows tests/test_samples.py: the first finding above ``info`` severity is the diagnosis; a
healthy scenario (expected top ``None``) is right when no finding is at ``warning`` or above.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnose.model import SEVERITY_WEIGHT

HEALTHY = "(none)"  # label of "no finding at warning or above" in tables


@dataclass
class ScenarioResult:
    name: str
    expected: str | None
    top3_ok: tuple[str, ...] = ()
    findings: list[dict[str, Any]] = field(default_factory=list)  # [{rule_id, severity, score, title}]
    error: str | None = None  # the scenario could not run (engine, attach or analyze failed)
    seconds: float = 0.0
    repeat: int = 1
    command: str = ""  # the attach command line
    engine: str = ""  # the engine's flags and environment
    loadavg: float = 0.0  # 1-minute load average of the machine when the scenario started

    @property
    def serious(self) -> list[dict[str, Any]]:
        # held-back findings (VAL006: the client's delay could explain them) are not asserted
        return [f for f in self.findings if f.get("severity") != "info" and not f.get("held_back")]

    @property
    def top1(self) -> str:
        if self.error:
            return "(error)"
        s = self.serious
        if not s:
            return HEALTHY
        if self.expected is None and SEVERITY_WEIGHT.get(str(s[0].get("severity")), 0) < SEVERITY_WEIGHT["warning"]:
            return HEALTHY
        return str(s[0]["rule_id"])

    @property
    def top3(self) -> list[str]:
        return [str(f["rule_id"]) for f in self.serious[:3]]

    @property
    def ok1(self) -> bool:
        if self.error:
            return False
        if self.expected is None:
            return not [f for f in self.serious
                        if SEVERITY_WEIGHT.get(str(f.get("severity")), 0) >= SEVERITY_WEIGHT["warning"]]
        return self.top1 == self.expected

    @property
    def ok3(self) -> bool:
        if self.error:
            return False
        if self.expected is None:
            return self.ok1
        return self.expected in self.top3


def findings_from_json(path: Path) -> list[dict[str, Any]]:
    """The findings of `diagnose analyze --json`, best first (the file's own order)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for f in doc.get("findings") or []:
        if isinstance(f, dict) and "rule_id" in f:
            out.append({k: f.get(k) for k in ("rule_id", "severity", "score", "title", "confidence", "impact",
                                              "held_back", "explained_by")})
    return out


def accuracy(results: list[ScenarioResult]) -> tuple[int, int, int]:
    """(top-1 correct, top-3 correct, scenarios)."""
    return sum(r.ok1 for r in results), sum(r.ok3 for r in results), len(results)


def _label(expected: str | None) -> str:
    return HEALTHY if expected is None else expected


def confusion_markdown(results: list[ScenarioResult]) -> str:
    """Rows: scenario (expected rule); columns: top-1 finding; cells: counts over repeats."""
    cols: list[str] = []
    for r in results:
        for lab in (_label(r.expected), r.top1):
            if lab not in cols:
                cols.append(lab)
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for r in results:
        row = rows.setdefault((r.name, _label(r.expected)), {})
        row[r.top1] = row.get(r.top1, 0) + 1
    head = "| scenario | expected | " + " | ".join(cols) + " |"
    sep = "|---|---|" + "---|" * len(cols)
    lines = [head, sep]
    for (name, exp), counts in rows.items():
        cells = []
        for c in cols:
            n = counts.get(c, 0)
            cells.append(f"**{n}**" if n and c == exp else (str(n) if n else "."))
        lines.append(f"| {name} | {exp} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_markdown(results: list[ScenarioResult]) -> str:
    lines = ["| run | scenario | expected | top-1 | ok | top-3 (severity, score) | seconds | load avg |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        top3 = ", ".join(f"{f['rule_id']} ({f['severity']}, {float(f.get('score') or 0):.2f})" for f in r.serious[:3])
        if r.error:
            top3 = f"error: {r.error}"
        lines.append(f"| {r.repeat} | {r.name} | {_label(r.expected)} | {r.top1} | {'yes' if r.ok1 else 'NO'} | "
                     f"{top3 or '-'} | {r.seconds:.0f} | {r.loadavg:.1f} |")
    return "\n".join(lines)


def report_markdown(results: list[ScenarioResult], header: str) -> str:
    parts = [header, ""]
    for rep in sorted({r.repeat for r in results}):
        rr = [r for r in results if r.repeat == rep]
        a1, a3, n = accuracy(rr)
        parts += [f"## Run {rep}: top-1 {a1}/{n}, top-3 {a3}/{n}", "", confusion_markdown(rr), ""]
    a1, a3, n = accuracy(results)
    parts += [f"## All runs: top-1 {a1}/{n}, top-3 {a3}/{n}", "", detail_markdown(results), ""]
    return "\n".join(parts)
