"""The readiness card: each check's status (pass, fail, not run), the numbers behind it and the fix to try.

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

from collections.abc import Collection, Mapping
from typing import Any

from diagnose.io import schemas
from diagnose.numbers import fmt_value

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
KEPT_UP = 0.9  # a step kept up when its completions per second were at least this share of its arrivals

FIX_LEAK = ("Make client disconnects reach the engine: vLLM aborts a request when its HTTP connection closes, "
            "llama.cpp frees a slot when it finds the connection closed; a proxy or gateway in front of the server "
            "that buffers responses or keeps the upstream connection open (nginx proxy_buffering, a load balancer's "
            "idle timeout) hides the disconnect. Check it with this command against the server directly and through "
            "the proxy.")
FIX_KEPT = ("Aborting some streams broke others: read the server's log around the abort for errors, and check "
            "that the server handles a closed connection without failing the batch it belongs to.")
FIX_STALE = ("Nothing leaked, but a router or autoscaler that reads these gauges sees this replica busy until its "
             "next request (vLLM refreshes them only when a step runs: vllm#29928); route on your own in-flight "
             "counts or upgrade to a build that flushes its stats after aborts.")
FIX_UNBOUNDED = ("Bound the queue: admit what the server serves within the SLO and answer the rest at once with 429 "
                 "and a Retry-After, so clients back off instead of waiting or timing out (vLLM and llama-server "
                 "queue without a limit: put a concurrency limit in front, in the gateway or router), and scale "
                 "out on queue depth or TTFT, not on CPU or GPU use.")
FIX_ERRORS = ("Requests failed or timed out under overload instead of being rejected: read the server's log for "
              "the errors, raise the gateway's and the client's timeouts above the SLO's worst case or, better, "
              "reject early with 429 and a Retry-After (see above).")
FIX_RECOVERY = ("The backlog outlived the overload: a bounded queue (429 with Retry-After past a limit) or "
                "request deadlines that drop work whose client has given up shorten it; check that clients do not "
                "retry without backing off.")
FIX_DOWN = ("A restart this slow leaves a single replica's users without service for all of it: keep a second "
            "replica behind the load balancer, and shorten the start (local model files, compilation caches kept "
            "between restarts) before relying on restarts for recovery.")
FIX_HEALTH = ("The server said healthy before it could serve: point the load balancer's readiness probe at a "
              "real completion (or an endpoint that answers only once the model is loaded and warmed), not at "
              "liveness alone.")
FIX_STORM = ("Clients retried faster than they completed before the crash: cap retries, back off exponentially "
             "with jitter, honour Retry-After, and answer 503 with a Retry-After while starting, so a recovering "
             "server is not buried by the retries of its own clients.")
FIX_COLD = ("Warm the server up before it takes traffic: send a few completions (the lengths you serve) before the "
            "readiness probe reports ready, keep compilation caches between restarts (vLLM's torch.compile cache, "
            "CUDA graphs captured at start), and load the model from local disk.")


def _f(v: Any, unit: str = "") -> str:
    """A number in a card's sentence: the project's one formatter (diagnose.numbers.fmt_value: 1,440, never
    1.44e+03), "n/a" where nothing was measured."""
    return "n/a" if v is None else f"{fmt_value(v)}{unit}"


NOT_ASKED = "not asked for (--checks)"


def cancellation(m: Mapping[str, Any] | None, thr: Mapping[str, float]) -> dict[str, Any]:
    bound = thr[RELEASE]
    c: dict[str, Any] = {"id": "RDY001", "check": "cancellation", "title": "Aborted streams release their work"}
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
    rel, idle = m.get("release_s"), m.get("idle_s")
    stale = m.get("stale_gauge")
    if stale is not None and (rel is None or rel <= bound):
        numbers["stale_in_flight"] = stale.get("in_flight")
        when = f"in {rel:.2f} s" if rel is not None else "(seen once another request ran a step)"
        return c | {"status": PASS, "numbers": numbers, "fix": FIX_STALE,
                    "summary": (f"{m.get('aborted')} of {m.get('streams')} streams aborted: the engine released "
                                f"their work {when}, but its in-flight gauges stayed at "
                                f"{stale.get('in_flight')} after the last stream until another request ran a step "
                                "(stale metrics, not leaked work)") + tput}
    if rel is not None and idle is not None and (rel > bound or idle > bound):
        # both seen, one later than the bound (a run judged again with a tighter bound: --from): slow, not stuck
        late = [f"{what} {v:.2f} s {when}" for what, v, when in (
            ("dropped in", rel, "after the abort"), ("was back to idle", idle, "after the last kept stream"))
            if v > bound]
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_LEAK,
                    "summary": (f"slow release: the engine's in-flight work {' and '.join(late)}, past the bound "
                                f"of {bound:g} s ({numbers['in_flight_before']} in flight before the check)")
                    + tput}
    if rel is None or idle is None:
        st = m.get("leaked_state") or m.get("leaked_during") or {}
        where = (f"slots {', '.join(str(s) for s in st['busy_slots'])} still busy" if st.get("busy_slots") else
                 f"running {_f(st.get('running'))}, waiting {_f(st.get('waiting'))}"
                 + (f", KV cache {_f(st['kv_usage'] * 100, '%')}" if st.get("kv_usage") is not None else ""))
        phase = "after the last kept stream ended" if idle is None else "after the abort"
        n = m.get("leaked") if m.get("leaked") is not None else "some"
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_LEAK,
                    "summary": (f"leaked work: {n} request(s) still in flight on the engine {bound:g} s {phase} "
                                f"({where}; {numbers['in_flight_before']} in flight before the check)") + tput}
    if m.get("kept_failed"):
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_KEPT,
                    "summary": (f"the engine released the aborted work in {rel:.2f} s, but "
                                f"{len(m['kept_failed'])} kept stream(s) failed: {'; '.join(m['kept_failed'][:2])}")}
    return c | {"status": PASS, "numbers": numbers, "fix": "",
                "summary": (f"{m.get('aborted')} of {m.get('streams')} streams aborted after their first tokens: "
                            f"the engine's in-flight work dropped in {rel:.2f} s and was back to idle {idle:.2f} s "
                            f"after the last kept stream (bound {bound:g} s)") + tput}


def cold_start(m: Mapping[str, Any] | None, thr: Mapping[str, float], slo: Mapping[str, float],
               asked: bool = True) -> dict[str, Any]:
    c: dict[str, Any] = {"id": "RDY002", "check": "cold start", "title": "A fresh server answers its first users "
                                                                        "as fast as warm ones"}
    if m is None:
        return c | {"status": NOT_RUN, "numbers": {}, "fix": "",
                    "summary": "needs --launch COMMAND (diagnose times a server it starts itself)" if asked
                    else NOT_ASKED}
    limit = thr[COLD_RATIO]
    ttft_slo = {k: v for k, v in slo.items() if k.startswith("ttft_")}
    numbers = {k: m.get(k) for k in ("healthy_s", "first_token_s", "first_ttft_ms", "cold_ttft_p50_ms",
                                     "warm_ttft_p50_ms", "first_vs_warm_ratio", "cold_vs_warm_ratio")}
    numbers["ratio_max"] = limit
    if ttft_slo:
        numbers["slo_ttft_ms"] = min(ttft_slo.values())
    head = (f"healthy {_f(m.get('healthy_s'), ' s')} after the start, first token at {_f(m.get('first_token_s'), ' s')}; "
            f"first request TTFT {_f(m.get('first_ttft_ms'), ' ms')}, cold P50 {_f(m.get('cold_ttft_p50_ms'), ' ms')}, "
            f"warm P50 {_f(m.get('warm_ttft_p50_ms'), ' ms')}")
    if m.get("first_request_failed"):
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_COLD,
                    "summary": f"the first request after healthy failed ({m['first_request_failed']}): {head}"}
    ratio = m.get("first_vs_warm_ratio")
    if ratio is None:
        return c | {"status": NOT_RUN, "numbers": numbers, "fix": "",
                    "summary": f"not judged: too few requests got a first token ({m.get('failed_count')} failed): {head}"}
    over_slo = "slo_ttft_ms" in numbers and m["first_ttft_ms"] > numbers["slo_ttft_ms"]
    if ratio > limit or over_slo:
        why = (f"the first request waited {ratio:.1f}x the warm TTFT (at most {limit:g}x)" if ratio > limit else
               f"the first request's TTFT is over the SLO's {numbers['slo_ttft_ms']:g} ms")
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_COLD, "summary": f"{why}: {head}"}
    return c | {"status": PASS, "numbers": numbers, "fix": "",
                "summary": f"first request {ratio:.1f}x the warm TTFT (at most {limit:g}x): {head}"}


def _top_limit(m: Mapping[str, Any], thr: Mapping[str, float], slo: Mapping[str, float]) -> tuple[float | None, str]:
    """The TTFT P99 the admitted requests of the top step must keep, and how it is made (in words: its figures
    are in the step table): the SLO's TTFT term; else the TTFT P99 of the step at the capacity (the highest at or
    below 1x) plus ``readiness_overload_wait_requests_max`` times its e2e P50. A bounded queue (a gateway's limit
    in front of the engine) lets an admitted request wait a request's time or two past the capacity; an
    unbounded one grows the wait for as long as the overload lasts."""
    ttft_slo = [v for k, v in slo.items() if k.startswith("ttft_")]
    if ttft_slo:
        return min(ttft_slo), "the SLO's TTFT term"
    steps = m.get("steps") or []
    # the reference is a step the server kept up with: a 1x step already falling behind (the capacity phase
    # over-measured a host that got busier) queues, and its TTFT P99 would make a limit an unbounded queue
    # stays under (CI, llama-server on a loaded host: 10.6 s at 2x "within" 12.2 s made from such a 1x step)
    at_or_below = [st for st in steps if st["factor"] <= 1.0]
    kept = [st for st in at_or_below if _kept_up(st)]
    ref = kept[-1] if kept else at_or_below[0] if at_or_below else steps[0] if steps else {}
    if ref.get("ttft_p99_ms") is None or ref.get("e2e_p50_ms") is None:
        return None, ""
    k = thr[OVER_WAIT]
    behind = "" if kept else ", a step already behind its arrivals"
    return (ref["ttft_p99_ms"] + k * ref["e2e_p50_ms"],
            f"the {ref['factor']:g}x step's TTFT P99 plus {k:g} of its requests' times, e2e P50{behind}")


def _kept_up(st: Mapping[str, Any]) -> bool:
    """The server completed about what arrived during the step (at least ``KEPT_UP`` of it)."""
    return st.get("done_rps") is not None and st["done_rps"] >= KEPT_UP * st["rate_rps"]


def overload(m: Mapping[str, Any] | None, thr: Mapping[str, float], slo: Mapping[str, float]) -> dict[str, Any]:
    c: dict[str, Any] = {"id": "RDY003", "check": "overload", "title": "Past its capacity the server bounds its "
                                                                     "queue, keeps what it admits and recovers"}
    if m is None:
        return c | {"status": NOT_RUN, "numbers": {}, "fix": "", "summary": NOT_ASKED}
    if "not_run" in m:
        return c | {"status": NOT_RUN, "numbers": {}, "fix": "", "summary": m["not_run"]}
    steps = m.get("steps") or []
    top = steps[-1]
    limit, limit_what = _top_limit(m, thr, slo)
    bound = thr[RECOVERY]
    rec = m.get("recovery_s")
    sent = sum(st["sent"] for st in steps)
    rejected = sum(st["rejected"] for st in steps)
    with_ra = sum(st["rejected_with_retry_after"] for st in steps)
    errors = sum(st["errors"] for st in steps)
    numbers = {"capacity_rps": m.get("capacity_rps"), "baseline_ttft_p50_ms": m.get("baseline_ttft_p50_ms"),
               "top_factor": top["factor"], "top_rate_rps": top["rate_rps"], "top_done_rps": top.get("done_rps"),
               "top_ttft_p99_ms": top.get("ttft_p99_ms"), "top_ttft_p99_limit_ms": limit, "sent": sent,
               "rejected": rejected, "rejected_with_retry_after": with_ra, "errors": errors,
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
    over = limit is not None and top.get("ttft_p99_ms") is not None and top["ttft_p99_ms"] > limit
    if errors:
        ex = "; ".join(e for st in steps for e in st.get("error_examples", []))[:300]
        return c | {"status": FAIL, "fix": FIX_ERRORS,
                    "summary": f"{errors} of {sent} requests failed or timed out under overload instead of being "
                               f"rejected ({ex}); {recovered}"}
    if over:
        what = ("unbounded queue: nothing was rejected, and" if not rejected else
                f"{rejected} requests were rejected, yet")
        return c | {"status": FAIL, "fix": FIX_UNBOUNDED,
                    "summary": f"{what} {at} the requests it admitted waited past {limit_s} for their first token "
                               f"at the P99; {recovered}"}
    if top.get("open_capped") and not rejected:
        # the server held as many open requests as the client would send without rejecting one: the client's
        # cap, not the server, bounded what the admitted requests waited, so their TTFT cannot pass the check
        # (a fast host: 279 of the 2x step's 590 arrivals not sent, TTFT P99 2.3 s "within" a limit of 9.6 s
        # made by a 1x step already queueing, and the card said "bounded")
        return c | {"status": FAIL, "fix": FIX_UNBOUNDED,
                    "summary": f"unbounded queue: nothing was rejected, and {at} the server held the client's cap "
                               f"of {m.get('max_in_flight')} open requests without rejecting one; that cap, not "
                               f"the server, bounded what the admitted requests waited; {recovered}"}
    budget_capped = (top.get("client_capped") or 0) - (top.get("open_capped") or 0)
    if budget_capped > 0.5 * (top.get("planned") or 0):
        # the ramp's budget ran out before its top step: the server was never sent the rate the check judges
        # (truth_server, 237 req/s: 2,000 requests were spent by the end of the 1x step)
        return c | {"status": NOT_RUN, "fix": "",
                    "summary": f"not overloaded: the ramp's budget of {m.get('max_requests')} requests ran out "
                               f"before its top step was sent ({at}; raise --overload-max-requests or shorten "
                               "--overload-step)"}
    kept_up = _kept_up(top) and not rejected
    if kept_up:  # nothing was past its capacity: the check did not happen
        return c | {"status": NOT_RUN, "fix": "",
                    "summary": f"not overloaded: {at} completions kept up with arrivals and nothing was rejected, "
                               "so the capacity phase under-measured the server (raise --overload-concurrency or "
                               "give --overload-capacity)"}
    if rec is None or rec > bound:
        return c | {"status": FAIL, "fix": FIX_RECOVERY,
                    "summary": f"slow recovery: {recovered} (at most {bound:g} s); {at} the admitted requests kept "
                               f"their first tokens within {limit_s}"}
    how = (f"it rejected {rejected} requests with 429/503 ({with_ra} with a Retry-After)" if rejected else
           "no request was rejected, yet the admitted ones kept their latency")
    fix = ("Send a Retry-After with each 429/503 so clients know when to come back." if rejected and with_ra < rejected
           else "")
    return c | {"status": PASS, "fix": fix,
                "summary": f"bounded: {how}; {at} the admitted requests' TTFT P99 stayed within {limit_s}; "
                           f"{recovered}"}


def failure(m: Mapping[str, Any] | None, thr: Mapping[str, float], asked: bool = True) -> dict[str, Any]:
    c: dict[str, Any] = {"id": "RDY004", "check": "failure and recovery",
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
    rec, gap, amp = m.get("recovery_s"), m.get("health_gap_s"), m.get("retry_amplification")
    head = (f"{m.get('in_flight_at_crash')} requests in flight at the crash ({m.get('lost_in_flight_at_crash')} of "
            f"them never completed); {m.get('lost')} requests lost after {m.get('max_retries')} retries, "
            f"{m.get('recovered_by_retry')} completed on a retry; restart healthy in "
            f"{_f(m.get('restart_healthy_s'), ' s')}; {m.get('outage_attempts')} attempts during the outage "
            f"({_f(m.get('outage_attempts_per_s'))}/s, {_f(amp)}x the {_f(m.get('rps_before'))} completions/s "
            f"before); TTFT P99 {_f(m.get('ttft_before_p99_ms'), ' ms')} before, {_f(m.get('ttft_after_p99_ms'), ' ms')} "
            "after")
    if m.get("restart_failed") or rec is None:
        why = m.get("restart_failed") or "no request completed after the restart"
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_DOWN,
                    "summary": f"not recovered: {why}: {head}"}
    if rec > thr[RESTART]:
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_DOWN,
                    "summary": f"slow recovery: serving again {rec:.1f} s after the crash (at most "
                               f"{thr[RESTART]:g} s): {head}"}
    if gap is not None and gap > thr[HEALTH_GAP]:
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_HEALTH,
                    "summary": f"healthy before ready: the first completion came {gap:.1f} s after the server "
                               f"said healthy (at most {thr[HEALTH_GAP]:g} s): {head}"}
    if amp is not None and amp > thr[AMPLIFICATION]:
        return c | {"status": FAIL, "numbers": numbers, "fix": FIX_STORM,
                    "summary": f"retry storm: {amp:.1f}x the request rate during the outage (at most "
                               f"{thr[AMPLIFICATION]:g}x): {head}"}
    return c | {"status": PASS, "numbers": numbers, "fix": "",
                "summary": f"serving again {rec:.1f} s after the crash, {_f(gap, ' s')} after it said healthy; "
                           f"retries bounded: {head}"}


def document(url: str, launch: str | None, slo: Mapping[str, float], thr: Mapping[str, float],
             cancel: Mapping[str, Any] | None, cold: Mapping[str, Any] | None, target: Mapping[str, Any],
             over: Mapping[str, Any] | None = None, asked: Collection[str] = ("cold-start", "failure"),
             fail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    checks = [cancellation(cancel, thr), cold_start(cold, thr, slo, "cold-start" in asked), overload(over, thr, slo),
              failure(fail, thr, "failure" in asked)]
    failed = [c["id"] for c in checks if c["status"] == FAIL]
    ran = [c for c in checks if c["status"] != NOT_RUN]
    verdict = ("not ready: " + ", ".join(f"{c['id']} {c['check']}" for c in checks if c["status"] == FAIL)
               if failed else ("ready on the checks run" if ran else "nothing checked"))
    return schemas.versioned(schemas.READINESS, {
        "url": url, "launch": launch, "target": dict(target), "slo": dict(slo),
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
