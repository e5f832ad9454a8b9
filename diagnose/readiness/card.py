"""The readiness card: each check's status (pass, fail, not run), the numbers behind it and the fix to try.

The card judges nothing itself: a check fails when one of its rules fires (rules/catalog/readiness/, family
``readiness``, each naming its check in ``tags``: RDY011-RDY016 judge RDY001, RDY021-RDY023 RDY002, RDY031-RDY036
RDY003, RDY041-RDY044 RDY004), over the run's measurements as signals (diagnose/readiness/signals.py), through the
rules engine every other finding goes through. The failing rule's title is the check's summary and its
experiment the fix; an ``info`` rule (stale gauges, rejections without a Retry-After) leaves the check passed
with its fix as a note. What the card decides is whether a check ran at all (not asked, not run, not
overloaded: the premise of a check, not a judgement of the server), and the sentences of a pass.

Every number the card judges by is a threshold in rules/thresholds.yaml (``--threshold NAME=VALUE`` moves it):

* ``readiness_cancel_release_max_s``: RDY001 passes when the engine's in-flight work drops to what the client
  still reads within this many seconds of the abort, and back to what it was before the check within this many
  seconds of the last kept stream's end;
* ``readiness_cold_ttft_ratio_max``: RDY002 passes when the first request after a fresh start waits at most this
  many times the warm TTFT median for its first token (and within the SLO's TTFT term when one is given);
* ``readiness_overload_wait_requests_max``: RDY003 - at the top step of the overload ramp the requests the
  server admitted have a TTFT P99 at most the 1x step's plus this many of its requests' times (e2e P50), or
  within the SLO's TTFT term when one is given; when the 1x step fell behind its arrivals, the reference is
  the highest step at or below it that kept up (else the lowest step);
  A top step whose arrivals met the client's cap on open requests (``max_in_flight``; ``open_capped``, not
  the cap on requests in all) with none rejected fails too: the server queued all the client would send, and the cap, not the server, bounded the wait;
* ``readiness_recovery_max_s`` and ``readiness_recovery_ttft_ratio``: RDY003 - within this many seconds of the
  ramp's end, requests one at a time are back within this many times the baseline TTFT P50;
* ``readiness_restart_recovery_max_s``, ``readiness_health_gap_max_s``, ``readiness_retry_amplification_max``:
  RDY004 - after a crash and a restart the server serves again within the first; it serves within the second
  of saying healthy; the clients' attempts per second during the outage stay within the third times the
  completions per second before the crash.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Required, TypedDict, Unpack

from diagnose.io import schemas
from diagnose.numbers import fmt_value
from diagnose.readiness import signals as rsig

if TYPE_CHECKING:
    from diagnose.model import Finding, Signal
    from diagnose.rules.spec import RuleSpec

RELEASE = "readiness_cancel_release_max_s"
COLD_RATIO = "readiness_cold_ttft_ratio_max"
OVER_WAIT = "readiness_overload_wait_requests_max"
RECOVERY = "readiness_recovery_max_s"
RECOVERED_RATIO = "readiness_recovery_ttft_ratio"
RESTART = "readiness_restart_recovery_max_s"
HEALTH_GAP = "readiness_health_gap_max_s"
AMPLIFICATION = "readiness_retry_amplification_max"
THRESHOLDS = (RELEASE, COLD_RATIO, OVER_WAIT, RECOVERY, RECOVERED_RATIO, RESTART, HEALTH_GAP, AMPLIFICATION)
PASS, FAIL, NOT_RUN = "pass", "fail", "not run"

# each fix is its rule's experiment (rules/catalog/readiness/): the card shows the one of the rule that judged
_FIXES = {"FIX_LEAK": "RDY011", "FIX_KEPT": "RDY015", "FIX_STALE": "RDY016", "FIX_COLD": "RDY022",
          "FIX_ERRORS": "RDY031", "FIX_UNBOUNDED": "RDY032", "FIX_RECOVERY": "RDY035", "FIX_DOWN": "RDY041",
          "FIX_HEALTH": "RDY043", "FIX_STORM": "RDY044"}


def __getattr__(name: str) -> str:
    """``card.FIX_LEAK`` and the like: the fix a readiness rule gives (read from its YAML)."""
    if name in _FIXES:
        return fix(_FIXES[name])
    raise AttributeError(name)


@functools.cache
def rules() -> tuple[RuleSpec, ...]:
    """The readiness rules of the catalogue (family ``readiness``; each names the check it judges in ``tags``)."""
    from diagnose.rules.spec import load_rules

    return tuple(s for s in load_rules() if s.family == "readiness")


def check_of(spec: RuleSpec) -> str:
    tags = spec.raw.get("tags") or []
    return str(tags[0]) if tags else ""


def fix(rule_id: str) -> str:
    """A readiness rule's fix: its first cause's experiment, as written (no template in it)."""
    spec = next(s for s in rules() if s.id == rule_id)
    return " ".join(str(spec.causes[0]["experiment"]["change"]).split())


def judge(check: str, sigs: Mapping[str, Signal], thr: Mapping[str, float]) -> Finding | None:
    """The finding that judges one check: the strongest of its rules that fired (after their own suppressions),
    an error before an info note; None when none fired."""
    from diagnose.rules.engine import evaluate

    res = evaluate([s for s in rules() if check_of(s) == check], sigs, thr)
    return res.findings[0] if res.findings else None


def _fail(c: Check, f: Finding, summary: str, **extra: Unpack[FailExtra]) -> Check:
    return c | {"status": FAIL, "rule": f.rule_id, "fix": fix(f.rule_id), "summary": summary} | extra


def _f(v: Any, unit: str = "") -> str:
    """A number in a card's sentence: the project's one formatter (diagnose.numbers.fmt_value: 1,440, never
    1.44e+03), "n/a" where nothing was measured."""
    return "n/a" if v is None else f"{fmt_value(v)}{unit}"


NOT_ASKED = "not asked for (--checks)"


class Check(TypedDict, total=False):
    """One check of the card (readiness.json ``checks``): its status, the numbers behind it, the fix to try,
    and the rule that judged it (where one fired); the overload check adds its ramp's step table (``rows``)."""

    id: Required[str]
    check: Required[str]
    title: Required[str]
    status: str
    rule: str
    summary: str
    fix: str
    numbers: Mapping[str, object]
    rows: Sequence[Mapping[str, object]]


class FailExtra(TypedDict, total=False):
    numbers: Mapping[str, object]


class Note(TypedDict, total=False):
    rule: str
    fix: str


def cancellation(m: Mapping[str, Any] | None, thr: Mapping[str, float]) -> Check:
    bound = thr[RELEASE]
    c: Check = {"id": "RDY001", "check": "cancellation", "title": "Aborted streams release their work"}
    if m is None:
        return c | {"status": NOT_RUN, "summary": NOT_ASKED, "numbers": {}, "fix": ""}
    if "not_run" in m:
        return c | {"status": NOT_RUN, "summary": m["not_run"], "numbers": {}, "fix": ""}
    numbers = {"streams": m.get("streams"), "aborted": m.get("aborted"), "kept": m.get("kept"),
               "in_flight_before": (m.get("before") or {}).get("in_flight"),
               "in_flight_at_abort": (m.get("at_abort") or {}).get("in_flight"), "release_s": m.get("release_s"),
               "idle_s": m.get("idle_s"), "bound_s": bound, "leaked": m.get("leaked"),
               "kept_ok": m.get("kept_ok"), "kept_tps_per_stream_before": m.get("kept_tps_per_stream_before"),
               "kept_tps_per_stream_after": m.get("kept_tps_per_stream_after"),
               "kept_tps_after": m.get("kept_tps_after"), "source": m.get("source")}
    samples = m.get("samples") or []
    if (m.get("before") or {}).get("kv_usage") is not None:  # vLLM: the KV cache the work held, and what it left
        numbers["kv_usage_before"] = m["before"]["kv_usage"]
        numbers["kv_usage_at_abort"] = (m.get("at_abort") or {}).get("kv_usage")
        numbers["kv_usage_end"] = samples[-1].get("kv_usage") if samples else None
    unfinished = m.get("kept_unfinished") or 0
    numbers["kept_unfinished"] = unfinished
    tput = (f"; {unfinished} kept stream(s) still streaming after the time limit were closed too" if unfinished
            else "") + (f"; the {m.get('kept')} kept streams ran at {_f(m.get('kept_tps_per_stream_before'))} tok/s each before "
            f"the abort and {_f(m.get('kept_tps_per_stream_after'))} after ({_f(m.get('kept_tps_after'))} tok/s "
            "together)" if m.get("kept") else "")
    if m.get("first_try"):  # judged on the second try: say so, and why
        numbers["first_try_tokens"] = m["first_try"].get("max_tokens")
        tput += (f"; on a second try with {m.get('max_tokens')} tokens a stream (the first, with "
                 f"{m['first_try'].get('max_tokens')}: {m['first_try'].get('too_soon')})")
    f = judge("RDY001", rsig.cancellation(m), thr)
    if f is not None and f.severity != "info":  # leaked, slow, or kept streams broken: rules RDY011-RDY015
        return _fail(c, f, f.title + tput, numbers=numbers)
    if f is not None:  # released, with a note (RDY016: stale gauges)
        stale = m.get("stale_gauge") or {}
        numbers["stale_in_flight"] = stale.get("in_flight")
        return c | {"status": PASS, "rule": f.rule_id, "numbers": numbers, "fix": fix(f.rule_id),
                    "summary": f.title + tput}
    rel, idle = m.get("release_s"), m.get("idle_s")
    return c | {"status": PASS, "numbers": numbers, "fix": "",
                "summary": (f"{m.get('aborted')} of {m.get('streams')} streams aborted after their first tokens: "
                            f"the engine's in-flight work dropped in {rel:.2f} s and was back to idle {idle:.2f} s "
                            f"after the last kept stream (bound {bound:g} s)") + tput}


def cold_start(m: Mapping[str, Any] | None, thr: Mapping[str, float], slo: Mapping[str, float],
               asked: bool = True) -> Check:
    c: Check = {"id": "RDY002", "check": "cold start", "title": "A fresh server answers its first users "
                                                                        "as fast as warm ones"}
    if m is None:
        return c | {"status": NOT_RUN, "numbers": {}, "fix": "",
                    "summary": "needs --launch COMMAND (diagnose times a server it starts itself)" if asked
                    else NOT_ASKED}
    limit = thr[COLD_RATIO]
    ttft_slo = rsig.slo_ttft_ms(slo)
    numbers = {k: m.get(k) for k in ("healthy_s", "first_token_s", "first_ttft_ms", "cold_ttft_p50_ms",
                                     "warm_ttft_p50_ms", "first_vs_warm_ratio", "cold_vs_warm_ratio")}
    numbers["ratio_max"] = limit
    if ttft_slo is not None:
        numbers["slo_ttft_ms"] = ttft_slo
    head = (f"healthy {_f(m.get('healthy_s'), ' s')} after the start, first token at {_f(m.get('first_token_s'), ' s')}; "
            f"first request TTFT {_f(m.get('first_ttft_ms'), ' ms')}, cold P50 {_f(m.get('cold_ttft_p50_ms'), ' ms')}, "
            f"warm P50 {_f(m.get('warm_ttft_p50_ms'), ' ms')}")
    f = judge("RDY002", rsig.cold_start(m, slo), thr)
    if f is not None:  # the first request failed, was slow against the warm ones, or missed the SLO
        return _fail(c, f, f"{f.title}: {head}", numbers=numbers)
    ratio = m.get("first_vs_warm_ratio")
    if ratio is None:
        return c | {"status": NOT_RUN, "numbers": numbers, "fix": "",
                    "summary": f"not judged: too few requests got a first token ({m.get('failed_count')} failed): {head}"}
    return c | {"status": PASS, "numbers": numbers, "fix": "",
                "summary": f"first request {ratio:.1f}x the warm TTFT (at most {limit:g}x): {head}"}


def overload(m: Mapping[str, Any] | None, thr: Mapping[str, float], slo: Mapping[str, float]) -> Check:
    c: Check = {"id": "RDY003", "check": "overload", "title": "Past its capacity the server bounds its "
                                                                     "queue, keeps what it admits and recovers"}
    if m is None:
        return c | {"status": NOT_RUN, "numbers": {}, "fix": "", "summary": NOT_ASKED}
    if "not_run" in m:
        return c | {"status": NOT_RUN, "numbers": {}, "fix": "", "summary": m["not_run"]}
    steps = m.get("steps") or []
    top = steps[-1]
    limit, limit_what = rsig.top_limit(m, thr, slo)
    bound = thr[RECOVERY]
    rec = m.get("recovery_s")
    n = rsig.totals(steps)
    rejected, with_ra = n["rejected"], n["rejected_with_retry_after"]
    numbers = {"capacity_rps": m.get("capacity_rps"), "baseline_ttft_p50_ms": m.get("baseline_ttft_p50_ms"),
               "top_factor": top["factor"], "top_rate_rps": top["rate_rps"], "top_done_rps": top.get("done_rps"),
               "top_ttft_p99_ms": top.get("ttft_p99_ms"), "top_ttft_p99_limit_ms": limit, **n,
               "client_capped": m.get("client_capped"), "unfinished_at_drain": m.get("unfinished_at_drain"),
               "recovery_s": rec, "recovery_max_s": bound}
    # the page's step table: each figure of a step is stated there and nowhere else on the page (the summary
    # below names the steps, the limit and the totals, never a step's own figure)
    rows = [{"step (x the capacity)": f"{st['factor']:g}x", "sent": st["sent"],
             "not sent (client's cap)": st["client_capped"], "completed": st["ok"], "rejected (429/503)": st["rejected"],
             "failed": st["errors"], "completions meanwhile (req/s)": st.get("done_rps"),
             "TTFT P50 (ms)": st.get("ttft_p50_ms"), "TTFT P99 (ms)": st.get("ttft_p99_ms"),
             "e2e P50 (ms)": st.get("e2e_p50_ms")} for st in steps]
    c |= {"numbers": numbers, "rows": rows}
    at = f"at {top['factor']:g}x the measured capacity of {_f(m.get('capacity_rps'))} req/s"
    limit_s = f"{_f(limit, ' ms')} ({limit_what})"
    recovered = (f"latency back near the baseline {rec:.2f} s after the ramp" if rec is not None else
                 "latency not back near the baseline by the end of the recovery phase")
    f = judge("RDY003", rsig.overload(m, thr, slo), thr)
    if f is not None and f.severity != "info":  # errors, an unbounded queue, or a slow recovery: RDY031-RDY035
        return _fail(c, f, f.title if f.rule_id == "RDY035" else f"{f.title}; {recovered}")
    premise = rsig.overload_premise(m)
    if premise == "budget":
        # the ramp's budget ran out before its top step: the server was never sent the rate the check judges
        # (truth_server, 237 req/s: 2,000 requests were spent by the end of the 1x step)
        return c | {"status": NOT_RUN, "fix": "",
                    "summary": f"not overloaded: the ramp's budget of {m.get('max_requests')} requests ran out "
                               f"before its top step was sent ({at}; raise --overload-max-requests or shorten "
                               "--overload-step)"}
    if premise:  # nothing was past its capacity: the check did not happen
        return c | {"status": NOT_RUN, "fix": "",
                    "summary": f"not overloaded: {at} completions kept up with arrivals and nothing was rejected, "
                               "so the capacity phase under-measured the server (raise --overload-concurrency or "
                               "give --overload-capacity)"}
    how = (f"it rejected {rejected} requests with 429/503 ({with_ra} with a Retry-After)" if rejected else
           "no request was rejected, yet the admitted ones kept their latency")
    note: Note = {"rule": f.rule_id, "fix": fix(f.rule_id)} if f is not None else {"fix": ""}  # RDY036: no Retry-After
    return c | {"status": PASS, **note,
                "summary": f"bounded: {how}; {at} the admitted requests' TTFT P99 stayed within {limit_s}; "
                           f"{recovered}"}


def failure(m: Mapping[str, Any] | None, thr: Mapping[str, float], asked: bool = True) -> Check:
    c: Check = {"id": "RDY004", "check": "failure and recovery",
                         "title": "After a crash and a restart the server serves again, soon, and retries stay "
                                  "bounded"}
    if m is None:
        return c | {"status": NOT_RUN, "numbers": {}, "fix": "",
                    "summary": "needs --launch COMMAND (diagnose kills and restarts a server it starts itself)"
                    if asked else NOT_ASKED}
    keys = ("in_flight_at_crash", "lost", "lost_in_flight_at_crash", "recovered_by_retry", "restart_healthy_s",
            "recovery_s", "health_gap_s", "outage_attempts", "outage_attempts_per_s", "rps_before",
            "retry_amplification", "attempts_per_request_max", "ttft_before_p50_ms", "ttft_before_p99_ms",
            "ttft_after_p50_ms", "ttft_after_p99_ms", "completed_before", "completed_after")
    numbers = {k: m.get(k) for k in keys}
    numbers |= {"recovery_max_s": thr[RESTART], "health_gap_max_s": thr[HEALTH_GAP],
                "retry_amplification_max": thr[AMPLIFICATION]}
    rec, gap, amp = m.get("recovery_s"), m.get("health_gap_s"), m.get("retry_amplification")  # judged: RDY041-4
    head = (f"{m.get('in_flight_at_crash')} requests in flight at the crash ({m.get('lost_in_flight_at_crash')} of "
            f"them never completed); {m.get('lost')} requests lost after {m.get('max_retries')} retries, "
            f"{m.get('recovered_by_retry')} completed on a retry; restart healthy in "
            f"{_f(m.get('restart_healthy_s'), ' s')}; {m.get('outage_attempts')} attempts during the outage "
            f"({_f(m.get('outage_attempts_per_s'))}/s, {_f(amp)}x the {_f(m.get('rps_before'))} completions/s "
            f"before); TTFT P99 {_f(m.get('ttft_before_p99_ms'), ' ms')} before, {_f(m.get('ttft_after_p99_ms'), ' ms')} "
            "after")
    f = judge("RDY004", rsig.failure(m), thr)
    if f is not None:  # not recovered, slow, healthy before ready, or a retry storm: RDY041-RDY044
        return _fail(c, f, f"{f.title}: {head}", numbers=numbers)
    return c | {"status": PASS, "numbers": numbers, "fix": "",
                "summary": f"serving again {rec:.1f} s after the crash, {_f(gap, ' s')} after it said healthy; "
                           f"retries bounded: {head}"}


def document(url: str, launch: str | None, slo: Mapping[str, float], thr: Mapping[str, float],
             cancel: Mapping[str, Any] | None, cold: Mapping[str, Any] | None, target: Mapping[str, Any],
             over: Mapping[str, Any] | None = None, asked: Collection[str] = ("cold-start", "failure"),
             fail: Mapping[str, Any] | None = None) -> dict[str, object]:
    checks = [cancellation(cancel, thr), cold_start(cold, thr, slo, "cold-start" in asked), overload(over, thr, slo),
              failure(fail, thr, "failure" in asked)]
    failed = [c["id"] for c in checks if c["status"] == FAIL]
    ran = [c for c in checks if c["status"] != NOT_RUN]
    verdict = ("not ready: " + ", ".join(f"{c['id']} {c['check']}" for c in checks if c["status"] == FAIL)
               if failed else ("ready on the checks run" if ran else "nothing checked"))
    return schemas.versioned(schemas.READINESS, {
        "url": url, "launch": launch, "target": dict(target), "slo": dict(slo), "asked": sorted(asked),
        "thresholds": {k: thr[k] for k in THRESHOLDS}, "verdict": verdict, "failed": failed, "checks": checks,
        "measurements": {"cancellation": dict(cancel) if cancel is not None else None, "cold_start": dict(cold) if cold is not None else None,
                         "overload": dict(over) if over is not None else None,
                         "failure": dict(fail) if fail is not None else None}})


def lines(doc: Mapping[str, Any]) -> list[str]:
    out = [f"readiness of {doc['url']}: {doc['verdict']}"]
    for c in doc["checks"]:
        out.append(f"  {c['id']} {c['check']}: {c['status'].upper()}: {c['summary']}")
        for r in c.get("rows") or ():  # the overload ramp, a step a line
            out.append("    " + ", ".join(f"{k} {_f(v)}" for k, v in r.items()))
        if c["fix"]:
            out.append(f"    fix: {c['fix']}")
    return out
