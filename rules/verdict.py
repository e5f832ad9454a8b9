"""The one verdict of an analysis, written here by the judgement stage; reports and the CLI only show it.

A run is judged only when it is valid: a critical validity finding (the load client was the bottleneck, ...)
or a capture whose load ran but measured no request makes every other finding "not judged", and the verdict
names why instead of a cause.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from diagnose.model import Finding, Signal, Verdict, VerdictLevel

ALARM = ("warning", "error", "critical")


def ranked(findings: Sequence[Finding]) -> list[Finding]:
    """Findings most important first: the order the verdict, the report and --json use."""
    return sorted(findings, key=lambda f: (-f.score, f.rule_id))


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


def decide(findings: Sequence[Finding], signals: Mapping[str, Signal], *, partial: bool = False,
           load_ran: bool = False) -> Verdict:
    """The verdict. ``load_ran``: the capture sent a workload (so measured requests are expected)."""
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
    top = ranked([f for f in findings if f.severity in ALARM])
    if top:
        f = top[0]
        more = len(top) - 1
        level: VerdictLevel = f.severity
        return Verdict(level, f"{prefix}Most likely: {f.title}",
                       f.hypothesis + (f" ({more} more finding{'s' if more > 1 else ''} at warning or above below.)"
                                       if more else ""), partial=partial, top_rule=f.rule_id)
    if not signals and findings:
        f = ranked(findings)[0]
        return Verdict("info", f"{prefix}Most likely: {f.title}", f.hypothesis, partial=partial, top_rule=f.rule_id)
    return Verdict("ok", f"{prefix}No bottleneck found at warning level or above.",
                   "No rule found a bottleneck in the evidence captured.", partial=partial)
