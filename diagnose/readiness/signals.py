"""A readiness run's measurements as named signals: what the readiness rules (rules/catalog/readiness/) judge.

Each check's signals exist only when the check ran (a signal the run did not measure is absent, never zero);
``readiness_<check>_judged`` (1) marks a check whose measurements can be judged, so a rule about a check that did
not run is not evaluated rather than quiet. A few signals carry text in their description, shown by the rules'
sentences as ``{label.<signal>}`` (the slots left busy, the first errors), as fleet signals carry a replica's name.
The limit RDY003 holds the top step's TTFT P99 to is computed here, once (``readiness_over_top_ttft_limit_ms``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diagnose.model import Signal, Source
from diagnose.signals.catalog import CATALOG

RELEASE = "readiness_cancel_release_max_s"
OVER_WAIT = "readiness_overload_wait_requests_max"
KEPT_UP = 0.9  # a step kept up when its completions per second were at least this share of its arrivals


class _Out(dict[str, Signal]):
    def put(self, name: str, value: Any, description: str | None = None) -> None:
        """Add ``name`` when ``value`` is a number (None, a bool or text: absent); the unit and source as
        declared in the catalogue."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        spec = CATALOG[name]
        src: Source = spec.source
        self[name] = Signal(name, float(value), spec.unit, src, description or spec.description)


def slo_ttft_ms(slo: Mapping[str, float]) -> float | None:
    """The SLO's tightest TTFT term (ms), None without one."""
    terms = [float(v) for k, v in slo.items() if k.startswith("ttft_")]
    return min(terms) if terms else None


def cancellation(m: Mapping[str, Any] | None) -> dict[str, Signal]:
    out = _Out()
    if m is None or "not_run" in m:
        return out
    out.put("readiness_cancel_judged", 1)
    out.put("readiness_cancel_streams", m.get("streams"))
    out.put("readiness_cancel_aborted", m.get("aborted"))
    out.put("readiness_cancel_in_flight_before", (m.get("before") or {}).get("in_flight"))
    out.put("readiness_cancel_release_s", m.get("release_s"))
    out.put("readiness_cancel_idle_s", m.get("idle_s"))
    stale = m.get("stale_gauge")
    if isinstance(stale, Mapping):
        out.put("readiness_cancel_stale_in_flight", stale.get("in_flight"))
    out.put("readiness_cancel_leaked", m.get("leaked"))
    left = m.get("leaked_state") or m.get("leaked_during") or {}
    if left.get("busy_slots"):
        out.put("readiness_cancel_left_busy_slots", len(left["busy_slots"]),
                ", ".join(str(s) for s in left["busy_slots"]))
    out.put("readiness_cancel_left_running", left.get("running"))
    out.put("readiness_cancel_left_waiting", left.get("waiting"))
    out.put("readiness_cancel_left_kv_usage_ratio", left.get("kv_usage"))
    failed = list(m.get("kept_failed") or [])
    out.put("readiness_cancel_kept_failed", len(failed), "; ".join(failed[:2]) or None)
    return out


def cold_start(m: Mapping[str, Any] | None, slo: Mapping[str, float]) -> dict[str, Signal]:
    out = _Out()
    if m is None:
        return out
    out.put("readiness_cold_judged", 1)
    failed = m.get("first_request_failed")
    out.put("readiness_cold_first_failed", 1 if failed else 0, str(failed) if failed else None)
    out.put("readiness_cold_first_vs_warm_ratio", m.get("first_vs_warm_ratio"))
    out.put("readiness_cold_first_ttft_ms", m.get("first_ttft_ms"))
    out.put("readiness_slo_ttft_ms", slo_ttft_ms(slo))
    return out


def kept_up(st: Mapping[str, Any]) -> bool:
    """The server completed about what arrived during the step (at least ``KEPT_UP`` of it)."""
    return st.get("done_rps") is not None and st["done_rps"] >= KEPT_UP * st["rate_rps"]


def top_limit(m: Mapping[str, Any], thr: Mapping[str, float], slo: Mapping[str, float]) -> tuple[float | None, str]:
    """The TTFT P99 the admitted requests of the top step must keep, and how it is made (in words: its figures
    are in the step table): the SLO's TTFT term; else the TTFT P99 of the step at the capacity (the highest at or
    below 1x) plus ``readiness_overload_wait_requests_max`` times its e2e P50. A bounded queue (a gateway's limit
    in front of the engine) lets an admitted request wait a request's time or two past the capacity; an
    unbounded one grows the wait for as long as the overload lasts."""
    ttft = slo_ttft_ms(slo)
    if ttft is not None:
        return ttft, "the SLO's TTFT term"
    steps = m.get("steps") or []
    # the reference is a step the server kept up with: a 1x step already falling behind (the capacity phase
    # over-measured a host that got busier) queues, and its TTFT P99 would make a limit an unbounded queue
    # stays under (CI, llama-server on a loaded host: 10.6 s at 2x "within" 12.2 s made from such a 1x step)
    at_or_below = [st for st in steps if st["factor"] <= 1.0]
    kept = [st for st in at_or_below if kept_up(st)]
    ref = kept[-1] if kept else at_or_below[0] if at_or_below else steps[0] if steps else {}
    if ref.get("ttft_p99_ms") is None or ref.get("e2e_p50_ms") is None:
        return None, ""
    k = thr[OVER_WAIT]
    behind = "" if kept else ", a step already behind its arrivals"
    return (ref["ttft_p99_ms"] + k * ref["e2e_p50_ms"],
            f"the {ref['factor']:g}x step's TTFT P99 plus {k:g} of its requests' times, e2e P50{behind}")


def overload_premise(m: Mapping[str, Any]) -> str:
    """Why the ramp did not overload the server ('' when it did): its budget ran out before the top step, or
    the top step's completions kept up with its arrivals and nothing was rejected."""
    steps = m.get("steps") or []
    top = steps[-1]
    rejected = totals(steps)["rejected"]
    budget_capped = (top.get("client_capped") or 0) - (top.get("open_capped") or 0)
    if budget_capped > 0.5 * (top.get("planned") or 0):
        return "budget"
    return "kept up" if kept_up(top) and not rejected else ""


def totals(steps: list[Mapping[str, Any]]) -> dict[str, int]:
    """The ramp's counts over all its steps: sent, rejected (429/503), rejected with a Retry-After, errors."""
    return {"sent": sum(st["sent"] for st in steps), "rejected": sum(st["rejected"] for st in steps),
            "rejected_with_retry_after": sum(st["rejected_with_retry_after"] for st in steps),
            "errors": sum(st["errors"] for st in steps)}


def overload(m: Mapping[str, Any] | None, thr: Mapping[str, float], slo: Mapping[str, float]) -> dict[str, Signal]:
    out = _Out()
    if m is None or "not_run" in m or not m.get("steps"):
        return out
    steps = m["steps"]
    top = steps[-1]
    limit, limit_what = top_limit(m, thr, slo)
    out.put("readiness_over_ran", 1)
    out.put("readiness_over_overloaded", 0 if overload_premise(m) else 1)
    n = totals(steps)
    out.put("readiness_over_sent", n["sent"])
    out.put("readiness_over_rejected", n["rejected"])
    out.put("readiness_over_rejected_with_retry_after", n["rejected_with_retry_after"])
    examples = "; ".join(e for st in steps for e in st.get("error_examples", []))[:300]
    out.put("readiness_over_errors", n["errors"], examples or None)
    out.put("readiness_over_top_factor", top["factor"])
    out.put("readiness_over_capacity_rps", m.get("capacity_rps"))
    out.put("readiness_over_top_ttft_p99_ms", top.get("ttft_p99_ms"))
    out.put("readiness_over_top_ttft_limit_ms", limit, limit_what or None)
    out.put("readiness_over_open_capped", top.get("open_capped") or 0)
    out.put("readiness_over_max_in_flight", m.get("max_in_flight"))
    out.put("readiness_over_recovery_s", m.get("recovery_s"))
    return out


def failure(m: Mapping[str, Any] | None) -> dict[str, Signal]:
    out = _Out()
    if m is None:
        return out
    out.put("readiness_fail_judged", 1)
    if m.get("restart_failed"):
        out.put("readiness_fail_restart_failed", 1, str(m["restart_failed"]))
    out.put("readiness_fail_recovery_s", m.get("recovery_s"))
    out.put("readiness_fail_health_gap_s", m.get("health_gap_s"))
    out.put("readiness_fail_retry_amplification", m.get("retry_amplification"))
    return out
