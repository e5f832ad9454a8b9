"""The finding cards of the report's view: each finding as the page shows it, and the folding of a finding
that proposes the same experiment as a card above it (split out of view_model.py, which stays under 700 lines)."""

from __future__ import annotations

from collections.abc import Sequence

from diagnose.model import SEVERITY_WEIGHT, Cause, Finding

from .sections_view import finite
from .view_types import FindingView

ARROWS = {"down": "↓", "up": "↑", "flat": "→"}


def experiment_key(c: Cause) -> tuple[str, ...] | None:
    """What an experiment changes, to tell two apart: its variable and suggested value when it names one (the
    same flag to the same value is one experiment, however each rule words it), else its wording."""
    e = c.experiment
    if e is None:
        return None
    return (e.variable_kind, e.variable, e.value) if e.variable else ("change", e.change)


def _best_experiment(f: Finding) -> tuple[str, ...] | None:
    """The experiment of the finding's best cause: supported before open, never a ruled-out one (the cause
    the verdict names, rules.verdict.best_cause)."""
    for status in ("supported", "open"):
        for c in f.causes:
            if c.status == status:
                return experiment_key(c)
    return None


def _experiment_words(key: tuple[str, ...]) -> str:
    """An experiment key as the also-seen line names it: 'max_num_seqs = 16', or the change's own words."""
    if key[0] == "change":
        return key[1]
    return f"{key[1]} = {key[2]}" if key[2] else key[1]


def folds(findings: Sequence[Finding], top_rule: str | None = None) -> dict[str, str]:
    """Which findings restate another, and which: {rule id: the rule id of the card it folds into}.

    A finding folds into a higher-ranked one (``findings`` come ranked) when its best cause proposes the same
    experiment (:func:`experiment_key`: SCH003 'raise --max-num-seqs towards the offered concurrency' under
    SCH001 'raise --max-num-seqs (for example to the offered concurrency)', both max_num_seqs = 16): one card
    per change to try. Never folded: the verdict's own finding, validity findings (they judge the run, not the
    server), held-back ones, a consequence of a third finding, nor a finding more severe than the card."""
    out: dict[str, str] = {}
    cards: list[tuple[Finding, tuple[str, ...] | None]] = []
    for f in findings:
        key = _best_experiment(f)
        into = None
        if key is not None and f.rule_id != top_rule and f.family != "validity" and not f.held_back:
            into = next((g for g, gk in cards if gk == key and g.family != "validity"
                         and SEVERITY_WEIGHT.get(g.severity, 0.0) >= SEVERITY_WEIGHT.get(f.severity, 0.0)
                         and f.explained_by in ("", g.rule_id)), None)
        if into is not None:
            out[f.rule_id] = into.rule_id
        else:
            cards.append((f, key))
    return out


def _cards(findings: Sequence[Finding], run_label: str, top_rule: str | None) -> list[FindingView]:
    """The finding cards, ranked: the verdict's own finding marked (its title and hypothesis are the verdict,
    shown once, above), and each finding that restates a card (:func:`folds`) inside that card as an "also
    seen" entry holding only what the card does not already show: its evidence rows that are not the card's,
    its causes whose experiment the card does not propose."""
    into = folds(findings, top_rule)
    cards: dict[str, FindingView] = {}
    keys: dict[str, set[tuple[str, ...] | None]] = {}
    for f in findings:
        view = _finding(f, run_label)
        host = cards.get(into.get(f.rule_id, ""))
        if host is None:
            view["in_verdict"] = f.rule_id == top_rule
            view["also_seen"] = []
            cards[f.rule_id] = view
            keys[f.rule_id] = {experiment_key(c) for c in f.causes}
            continue
        shown = {e["signal"] for e in host["evidence"]}
        key = _best_experiment(f)
        view["why"] = f"proposes the same experiment: {_experiment_words(key)}" if key else ""
        view["evidence"] = [e for e in view["evidence"] if e["signal"] not in shown]
        view["causes"] = [cv for c, cv in zip(f.causes, view["causes"], strict=True)
                          if experiment_key(c) is None or experiment_key(c) not in keys[host["rule_id"]]]
        host["also_seen"].append(view)
    return list(cards.values())


def _finding(f: Finding, run_label: str = "whole run") -> FindingView:
    return {
        "rule_id": f.rule_id, "name": f.name, "family": f.family, "severity": f.severity,
        "severity_weight": SEVERITY_WEIGHT.get(f.severity, 0.0),
        "title": f.title, "hypothesis": f.hypothesis,
        "confidence": finite(f.confidence), "impact": finite(f.impact), "score": finite(f.score),
        "fit": finite(f.fit),
        "evidence": [{"signal": e.signal, "value": finite(e.value), "unit": e.unit, "source": e.source,
                      "note": e.note, "window": run_label if e.window == "run" else e.window} for e in f.evidence],
        "causes": [{
            "cause": c.cause, "confirm": c.confirm, "refute": c.refute, "status": c.status,
            "status_evidence": c.status_evidence,
            "experiment": None if c.experiment is None else {
                "change": c.experiment.change,
                "expect": [{"signal": s, "direction": d, "arrow": ARROWS.get(d, d)} for s, d in c.experiment.expect],
            },
        } for c in f.causes],
        "sources": list(f.sources), "runbook": f.runbook, "kind": f.kind, "explained_by": f.explained_by,
        "held_back": f.held_back,
        "share": finite(f.share) if f.share is not None else None,
    }


# -- percentile table -----------------------------------------------------------------------------------
