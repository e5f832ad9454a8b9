"""Evaluate rule specs over named signals: findings (ranked) and rules not evaluated (missing signals).

Rules only reference named signals; they never see probes or reports.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, TypedDict

from diagnose.engines.experiments import resolve_value
from diagnose.model import (
    SEVERITY_WEIGHT,
    Cause,
    CauseStatus,
    Evidence,
    Experiment,
    Finding,
    NotEvaluated,
    Signal,
)
from diagnose.numbers import fmt_value
from diagnose.rules.conditions import Evaluator, referenced_signals, resolve_threshold
from diagnose.rules.spec import RuleSpec

SOURCE_RANK = ("client", "server", "host", "gpu", "trace")
# how well a finding's evidence fits one of its candidate causes (docs/rules.md, "Ranking"): a cause the bundle
# supports, none decided either way, or every one ruled out by the bundle's own evidence
FIT_SUPPORTED, FIT_OPEN, FIT_ALL_RULED_OUT = 1.0, 0.8, 0.5
EXPLAINED_FLOOR = 0.05  # a cause whose measured share is about nothing still ranks by its fit among such causes


@dataclass
class EvaluationResult:
    findings: list[Finding] = field(default_factory=list)
    not_evaluated: list[NotEvaluated] = field(default_factory=list)
    quiet: list[str] = field(default_factory=list)  # rule ids evaluated and not firing
    suppressed: list[tuple[str, str]] = field(default_factory=list)  # (rule id, suppressed by)


class _SafeFormatter(string.Formatter):
    """str.format over signals that never raises: missing or non-numeric values print as 'unknown' (the bundle
    does not hold them; a rule never shows a guess in their place)."""

    def get_value(self, key: int | str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        if isinstance(key, str):
            return kwargs.get(key, "unknown")
        return "unknown"

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "v":  # {name:v}: the report's one number formatter (1,440, 0.47, 6.9; never 1.44e+03)
            return fmt_value(value)
        try:
            return str(super().format_field(value, format_spec))
        except (ValueError, TypeError):
            return str(value)


_FMT = _SafeFormatter()


class _Labels(SimpleNamespace):
    """``{label.<signal>}``: the signal's description; 'unknown' when the signal is missing."""

    def __init__(self, descriptions: Mapping[str, str]) -> None:
        super().__init__()
        self._d = dict(descriptions)

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._d.get(name) or "unknown"


# ``[[A||B]]`` in a text template: A when every signal A names is known, else B (else nothing), so a sentence
# about a value the bundle does not hold is left out or replaced instead of printing 'unknown' (docs/rules.md)
_OPTIONAL = re.compile(r"\[\[(.*?)\]\]", re.S)


def _known(text: str, values: Mapping[str, Any]) -> bool:
    """Whether every ``{field}`` of ``text`` names a value the bundle holds (a finite number for a signal)."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return False
    for _lit, name, _spec, _conv in parsed:
        if not name:
            continue
        top, _, rest = name.partition(".")
        top = top.split("[", 1)[0]
        if top == "label":
            if rest not in values["label"]._d:
                return False
        elif top not in ("thr", "phase"):
            v = values.get(top)
            if v is None or (isinstance(v, float) and not math.isfinite(v)) or v == "unknown":
                return False
    return True


def render_text(template: str, signals: Mapping[str, Signal], thresholds: Mapping[str, float],
                extra: Mapping[str, Any] | None = None) -> str:
    values: dict[str, Any] = {k: s.value for k, s in signals.items()}
    values["thr"] = SimpleNamespace(**thresholds)
    values["phase"] = "run"
    # {label.<signal>}: a signal's description, e.g. the replica a fleet signal is about (docs/fleet.md)
    values["label"] = _Labels({k: s.description for k, s in signals.items()})
    if extra:
        values.update(extra)

    def fmt(text: str) -> str:
        try:
            return _FMT.vformat(text, (), values)
        except (ValueError, IndexError, KeyError, AttributeError):
            return text

    out: list[str] = []
    pos = 0
    for m in _OPTIONAL.finditer(template):
        out.append(fmt(template[pos:m.start()]))
        out.append(next((fmt(alt) for alt in m.group(1).split("||") if _known(alt, values)), ""))
        pos = m.end()
    out.append(fmt(template[pos:]))
    return re.sub(r"  +", " ", "".join(out)) if pos else "".join(out)


def _impact(spec: RuleSpec, signals: Mapping[str, Signal], thresholds: Mapping[str, float]) -> float:
    """Estimated impact on the SLO metric, 0..1: how far the impact signal is past its reference."""
    imp = spec.impact
    if not imp:
        return 0.5
    sig = signals.get(str(imp.get("signal", "")))
    if sig is None or not sig.is_finite():
        return 0.5
    try:
        ref = Evaluator(signals, thresholds)._rhs(imp.get("over", 1.0))
    except ValueError:
        return 0.5
    if ref is None or ref <= 0:
        return 0.5
    ratio = float(sig.value) / ref
    if imp.get("lower_is_worse"):
        ratio = 1.0 / ratio if ratio > 0 else 10.0
    if ratio <= 1.0:
        return 0.1
    return max(0.1, min(1.0, 1.0 - 1.0 / ratio))


def rank_key(f: Finding) -> tuple[bool, bool, bool, bool, float, float, str]:
    """Findings most important first: a finding that invalidates the run (critical validity: the verdict says
    "run invalid" whatever else fired), then held-back and explained ones last, causes before symptoms (and
    consequences: goodput, cost, SLO misses are symptoms), then severity, then score (issue 34: a critical
    finding never ranks below an error-level one)."""
    invalidates = f.family == "validity" and f.severity == "critical"
    return (not invalidates, bool(f.held_back), bool(f.explained_by), f.kind == "symptom",
            -SEVERITY_WEIGHT[f.severity], -f.score, f.rule_id)


def _shown(s: Signal) -> str:
    """A signal's value as the report shows it: a ratio as a percentage, else the number and its unit."""
    return fmt_value(s.value, s.unit) if s.unit == "ratio" else f"{fmt_value(s.value)} {s.unit}".rstrip()


def _cause_status(c: Mapping[str, Any], signals: Mapping[str, Signal],
                  thresholds: Mapping[str, float]) -> tuple[CauseStatus, str]:
    """("ruled out" | "supported" | "open", the evidence that decided it) from the cause's conditions."""
    checks: tuple[tuple[str, CauseStatus], ...] = (("refuted_when", "ruled out"), ("supported_when", "supported"))
    for key, status in checks:
        cond = c.get(key)
        if cond is None:
            continue
        ev = Evaluator(signals, thresholds)
        if ev.evaluate(cond) is True:
            names = sorted(referenced_signals(cond))
            shown = ", ".join(f"{n} = {_shown(signals[n])}" for n in names if n in signals)
            return (status, shown)
    return "open", ""


def _experiment(exp: Mapping[str, Any], expect: tuple[tuple[str, str], ...], signals: Mapping[str, Signal],
                thresholds: Mapping[str, float]) -> Experiment:
    raw = exp.get("variable")
    var: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    return Experiment(change=render_text(str(exp.get("change", "")), signals, thresholds), expect=expect,
                      variable_kind=str(var.get("kind", "")), variable=str(var.get("name", "")),
                      value=resolve_value(var.get("value"), signals))


def _causes(spec: RuleSpec, signals: Mapping[str, Signal], thresholds: Mapping[str, float]) -> tuple[Cause, ...]:
    """The rule's candidate causes, each judged against the bundle's evidence: supported first, ruled out last."""
    out = []
    for c in spec.causes:
        exp = c.get("experiment") or {}
        expect = tuple((str(k), str(v)) for k, v in (exp.get("expect") or {}).items())
        status, why = _cause_status(c, signals, thresholds)
        out.append(
            Cause(
                cause=render_text(str(c["cause"]), signals, thresholds),
                confirm=render_text(str(c.get("confirm", "")), signals, thresholds),
                refute=render_text(str(c.get("refute", "")), signals, thresholds),
                experiment=_experiment(exp, expect, signals, thresholds) if exp else None,
                status=status,
                status_evidence=why,
            )
        )
    order = {"supported": 0, "open": 1, "ruled out": 2}
    return tuple(sorted(out, key=lambda x: order[x.status]))


def _evaluate_one(spec: RuleSpec, signals: Mapping[str, Signal], thresholds: Mapping[str, float],
                  phase_label: str | None) -> tuple[bool | None, set[str]]:
    missing = {s for s in spec.requires if s not in signals or not signals[s].is_finite()}
    if missing:
        return None, missing
    ev = Evaluator(signals, thresholds)
    result = ev.evaluate(spec.when)
    return result, ev.missing


def _finding(spec: RuleSpec, signals: Mapping[str, Signal], thresholds: Mapping[str, float],
             phase_label: str | None, phase_names: Collection[str] = ()) -> Finding:
    """The finding; with ``phase_label``, the evidence named in ``phase_names`` is that phase's and says so."""
    extra = {"phase": phase_label or "run"}
    ev_names = list(dict.fromkeys(list(spec.evidence) + list(spec.requires)))
    evidence = tuple(
        Evidence(signal=n, value=float(signals[n].value), unit=signals[n].unit, source=signals[n].source,
                 note=signals[n].description, window=phase_label if phase_label and n in phase_names else "run")
        for n in ev_names
        if n in signals and signals[n].is_finite()
    )
    sources = tuple(s for s in SOURCE_RANK if any(e.source == s for e in evidence))
    confidence = min(1.0, spec.confidence + 0.1 * max(0, len(sources) - 1))
    impact = _impact(spec, signals, thresholds)
    causes = _causes(spec, signals, thresholds)
    share = _share(spec, signals)
    fit = round(confidence * cause_fit(causes), 3)
    explained = share["share"] if share else impact
    severity = "info" if spec.minor_when and Evaluator(signals, thresholds).evaluate(spec.minor_when) is True \
        else spec.severity  # the impact gate: too small a share of the time to matter is info
    score = SEVERITY_WEIGHT.get(severity, 1.0) * fit * min(1.0, max(EXPLAINED_FLOOR, explained))
    title = render_text(spec.title, signals, thresholds, extra)
    if phase_label:
        title = f"{title} [{phase_label}]"
    return Finding(
        rule_id=spec.id,
        name=spec.name,
        family=spec.family,
        severity=severity,  # type: ignore[arg-type]
        title=title,
        hypothesis=render_text(spec.hypothesis, signals, thresholds, extra),
        confidence=round(confidence, 3),
        impact=round(impact, 3),
        score=round(score, 4),
        evidence=evidence,
        causes=causes,
        sources=sources,
        runbook=spec.runbook,
        kind=spec.kind,
        fit=fit,
        **share,
    )


def cause_fit(causes: Sequence[Cause]) -> float:
    """How well the evidence fits the finding's best candidate cause: one the bundle supports (or a finding
    without candidates), else one still open, else every candidate ruled out by the bundle's evidence."""
    statuses = {c.status for c in causes}
    if not causes or "supported" in statuses:
        return FIT_SUPPORTED
    return FIT_OPEN if "open" in statuses else FIT_ALL_RULED_OUT


class ShareOf(TypedDict, total=False):
    """A finding's ``share`` and ``share_of`` (both, or neither when none of the rule's signals is known)."""

    share: float
    share_of: str


def _share(spec: RuleSpec, signals: Mapping[str, Signal]) -> ShareOf:
    """``share`` (the first known of the rule's ``share:`` signals) and ``share_of`` (its name)."""
    for name in spec.share:
        s = signals.get(name)
        if s is not None and s.is_finite():
            return {"share": round(float(s.value), 4), "share_of": name}
    return {}


def evaluate(specs: Sequence[RuleSpec], signals: Mapping[str, Signal], thresholds: Mapping[str, float],
             phase_signals: Sequence[Mapping[str, Signal]] = (),
             phase_labels: Sequence[str] = ()) -> EvaluationResult:
    """Evaluate every rule. Run-scope rules see the run-level signals; phase-scope rules are evaluated on
    each phase's signals (falling back to run level when there are no phases) and report the worst phase."""
    res = EvaluationResult()
    fired: dict[str, Finding] = {}
    for spec in specs:
        if spec.scope == "phase" and phase_signals:
            best: Finding | None = None
            missing_all: set[str] = set()
            any_known = False
            for i, psig in enumerate(phase_signals):
                label = phase_labels[i] if i < len(phase_labels) else f"phase {i}"
                merged = dict(signals)
                merged.update(psig)
                r, missing = _evaluate_one(spec, merged, thresholds, label)
                if r is None:
                    missing_all |= missing
                    continue
                any_known = True
                if r:
                    f = _finding(spec, merged, thresholds, label if len(phase_signals) > 1 else None, set(psig))
                    if best is None or f.score > best.score:
                        best = f
            if best is not None:
                fired[spec.id] = best
            elif any_known:
                res.quiet.append(spec.id)
            else:
                res.not_evaluated.append(NotEvaluated(spec.id, spec.name, tuple(sorted(missing_all))))
            continue
        r, missing = _evaluate_one(spec, signals, thresholds, None)
        if r is None:
            res.not_evaluated.append(NotEvaluated(spec.id, spec.name, tuple(sorted(missing))))
        elif r:
            fired[spec.id] = _finding(spec, signals, thresholds, None)
        else:
            res.quiet.append(spec.id)
    by_id = {s.id: s for s in specs}
    for rid in list(fired):
        for other in by_id[rid].suppressed_by:
            if other in fired:
                res.suppressed.append((rid, other))
                del fired[rid]
                break
    link_explained(fired, by_id)
    hold_back(fired, by_id, signals)
    res.findings = sorted(fired.values(), key=rank_key)
    return res


def hold_back(fired: dict[str, Finding], by_id: Mapping[str, RuleSpec], signals: Mapping[str, Signal]) -> None:
    """A fired rule with ``holds_back: [sources]`` (VAL006: the client near its limit) holds back every other
    finding whose firing condition reads only signals of those sources: that evidence could be the client's own
    delay, so the finding is ranked last and never the verdict."""
    holders = [(rid, set(by_id[rid].holds_back)) for rid in sorted(fired) if rid in by_id and by_id[rid].holds_back]
    for holder, sources in holders:
        for rid, f in list(fired.items()):
            spec = by_id.get(rid)
            if rid == holder or spec is None or f.family == "validity" or f.held_back or spec.timing_free:
                continue
            read = {signals[n].source for n in referenced_signals(spec.when) if n in signals}
            if read and read <= sources:
                fired[rid] = replace(f, held_back=holder)


def link_explained(fired: dict[str, Finding], by_id: Mapping[str, RuleSpec]) -> None:
    """Mark each fired finding that a fired cause ``explains`` as explained by it (the strongest such cause;
    an explained cause still explains its own consequences) and drop its experiments: they address the
    consequence, and can worsen the cause (raising --max-num-seqs against queueing that KV preemption causes
    adds preemption)."""
    for f in sorted(fired.values(), key=rank_key):
        spec = by_id.get(f.rule_id)
        if spec is None:
            continue
        for target in spec.explains:
            t = fired.get(target)
            if t is None or t.explained_by or target == f.rule_id:
                continue
            causes = tuple(replace(c, experiment=None) for c in t.causes)
            fired[target] = replace(t, explained_by=f.rule_id, causes=causes)


def threshold_value(ref: Any, thresholds: Mapping[str, float]) -> float:
    v = resolve_threshold(ref, thresholds)
    if not math.isfinite(v):
        raise ValueError(f"threshold {ref!r} is not finite")
    return v
