"""The one verdict of an analysis, written here by the judgement stage; reports and the CLI only show it.

A run is judged only when it is valid: a critical validity finding (the load client was the bottleneck, ...)
or a capture whose load ran but measured no request makes every other finding "not judged", and the verdict
names why instead of a cause.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

from diagnose.engines.experiments import describe
from diagnose.model import Finding, Signal, Verdict, VerdictLevel
from diagnose.rules.engine import rank_key

ALARM = ("warning", "error", "critical")
CAPTURE_RULE = "TRC009"  # the trace is a graph-capture pass (diagnose/trace/capture.py), not serving


def ranked(findings: Sequence[Finding]) -> list[Finding]:
    """Findings most important first (causes before symptoms, then score): the order the verdict, the report
    and --json use."""
    return sorted(findings, key=rank_key)


def invalidating(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that make the run invalid (critical validity findings), most important first."""
    return ranked([f for f in findings if f.family == "validity" and f.severity == "critical"])


def key_numbers(signals: Mapping[str, Signal], where: str = "") -> str:
    """The headline numbers as one line (for the CLI; the report shows them as tiles)."""
    def v(name: str, fmt: str) -> str:
        s = signals.get(name)
        return format(s.value, fmt) if s is not None and s.is_finite() else "n/a"

    if "ttft_p50_ms" not in signals:
        return ""
    return (f"{where}TTFT P50/P95/P99 {v('ttft_p50_ms', '.0f')}/{v('ttft_p95_ms', '.0f')}/{v('ttft_p99_ms', '.0f')} ms, "
            f"ITL P50/P95/P99 {v('itl_p50_ms', '.1f')}/{v('itl_p95_ms', '.1f')}/{v('itl_p99_ms', '.1f')} ms, "
            f"{v('output_tps', '.0f')} output tok/s, {v('request_rps', '.2f')} req/s")


class CauseFields(TypedDict, total=False):
    cause: str
    cause_status: str
    cause_evidence: str
    refute: str
    experiment: str


def best_cause(f: Finding, engine: str | None = None) -> CauseFields:
    """The finding's best-supported candidate cause (supported before open; never one its evidence rules
    out), what would refute it and its experiment (with the one variable it changes, spelt for ``engine``),
    as Verdict fields."""
    for status in ("supported", "open"):
        for c in f.causes:
            if c.status != status:
                continue
            exp = ""
            if c.experiment is not None:
                moves = ", ".join(f"{sig} {d}" for sig, d in c.experiment.expect)
                exp = c.experiment.change + (f" (expect {moves})" if moves else "")
                if c.experiment.variable:
                    exp += "; changes " + describe(c.experiment.variable_kind, c.experiment.variable,
                                                   c.experiment.value, engine)
            return {"cause": c.cause, "cause_status": c.status, "cause_evidence": c.status_evidence,
                    "refute": c.refute, "experiment": exp}
    if f.causes:
        return {"cause": "every candidate cause is ruled out by the evidence", "cause_status": "ruled out"}
    return {}


def decide(findings: Sequence[Finding], signals: Mapping[str, Signal], *, partial: bool = False,
           load_ran: bool = False, engine: str | None = None) -> Verdict:
    """The verdict. ``load_ran``: the capture sent a workload (so measured requests are expected);
    ``engine``: the engine the bundle names (the experiment's flag is spelt for it)."""
    prefix = "Partial capture (interrupted). " if partial else ""
    bad = invalidating(findings)
    if bad:
        title = bad[0].title
        lead = title if title.lower().startswith("run invalid") else f"Run invalid: {title}"
        return Verdict("invalid", prefix + lead,
                       f"{bad[0].hypothesis} Do not draw conclusions about the server from this run: its other "
                       "findings are not judged.", judged=False, partial=partial, top_rule=bad[0].rule_id)
    measured = signals.get("requests_measured")
    if load_ran and (measured is None or not measured.value > 0):
        return Verdict("invalid", prefix + "Run invalid: no request was measured",
                       "The capture sent a workload but no request finished successfully inside the measured "
                       "window, so there is nothing to judge.", judged=False, partial=partial)
    top = ranked([f for f in findings if f.severity in ALARM and not f.held_back])
    if top:
        f = top[0]
        more = len(top) - 1
        level: VerdictLevel = f.severity
        if f.kind == "symptom":  # only symptoms fired: say what is out of line, and that no cause was found
            return Verdict(level, f"{prefix}Symptom without an identified cause: {f.title}",
                           f.hypothesis + " No cause rule fired: its candidate causes are listed below.",
                           partial=partial, top_rule=f.rule_id)
        explained = tuple(x.rule_id for x in findings if x.explained_by == f.rule_id)
        symptoms = [x for x in ranked(findings) if x.kind == "symptom" and x.severity in ALARM and not x.held_back]
        linked = [x for x in symptoms if x.explained_by == f.rule_id] or symptoms
        symptom = linked[0].title if linked else ""
        serving = [x for x in symptoms if x.family != "trace"]
        if linked and linked[0].family == "trace" and serving:  # the user's symptom first, the kernel trace's beside it
            symptom = f"{serving[0].title}; in the kernel trace: {linked[0].title}"
        return Verdict(level, f"{prefix}Most likely: {f.title}",
                       f.hypothesis + (f" ({more} more finding{'s' if more > 1 else ''} at warning or above below.)"
                                       if more else ""), partial=partial, top_rule=f.rule_id,
                       share=f.share, share_of=f.share_of, explains=explained, symptom=symptom,
                       **best_cause(f, engine))
    if not signals and findings:
        f = ranked(findings)[0]
        return Verdict("info", f"{prefix}Most likely: {f.title}", f.hypothesis, partial=partial, top_rule=f.rule_id)
    held = ranked([f for f in findings if f.severity in ALARM and f.held_back])
    if held:  # never "no bottleneck found" beside findings at warning or above (issue 34)
        by = sorted({f.held_back for f in held})
        n = len(held)
        return Verdict("info", f"{prefix}Not judged: {n} finding{'s' if n > 1 else ''} at warning or above "
                       f"held back ({', '.join(by)}): {held[0].title}",
                       f"{held[0].hypothesis} Its evidence rests on measurements that {', '.join(by)} doubts, so "
                       "it is shown below but not called a bottleneck; fix what holds it back and capture again.",
                       partial=partial, top_rule=held[0].rule_id)
    capture = next((f for f in findings if f.rule_id == CAPTURE_RULE), None)
    if capture is not None:  # a graph-capture pass holds no serving to judge: never "no bottleneck" (issue 35)
        return Verdict("info", f"{prefix}Not judged: {capture.title}",
                       f"{capture.hypothesis} Its other trace findings are withheld; profile a serving window to "
                       "judge the engine.", partial=partial, top_rule=capture.rule_id)
    return Verdict("ok", f"{prefix}No bottleneck found at warning level or above.",
                   "No rule found a bottleneck in the evidence captured.", partial=partial)
