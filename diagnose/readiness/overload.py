"""The overload check: past its capacity, does the server bound its queue (or reject with 429/503), keep the
latency of what it admits, and come back once the overload ends?

Three phases, each bounded in requests and in time:

1. **baseline**: ``baseline`` requests one at a time: the TTFT P50 of a server with nothing else to do;
2. **capacity**: a closed loop of ``concurrency`` streams for ``capacity_s``: the completions per second the
   server sustains (``capacity_rps``). ``--overload-capacity RPS`` gives it instead;
3. **ramp**: an open loop, requests sent at evenly spaced times whatever the server does, at each of
   ``factors`` times the capacity for ``step_s`` each (default 0.5x, 1x, 1.5x, 2x). At most ``max_in_flight``
   requests are open at once and ``max_requests`` sent in all: an arrival past either is not sent and is counted
   (``client_capped``), so the client never turns into the unbounded queue it is testing for;
4. **recovery**: from the last arrival of the ramp, requests one at a time (the backlog still in the server)
   until ``recovered_run`` in a row have a TTFT within ``readiness_recovery_ttft_ratio`` (rules/thresholds.yaml)
   of the baseline P50; ``recovery_s`` is the time from the end of the ramp to the first of them (None:
   not within ``recovery_limit_s``).

Each request of the ramp keeps its step, its outcome (ok; rejected: HTTP 429 or 503, with its Retry-After;
an error: a timeout, another status, a reset) and its TTFT. The card (``card.overload``) judges the top step.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypedDict

from diagnose.errors import InputError
from diagnose.probes.sse import StreamResult, sleep_until
from diagnose.readiness.record import CUT
from diagnose.readiness.target import Target, failure, ttft_ms
from diagnose.requests import percentiles

MAX_REQUESTS = 4000
MAX_IN_FLIGHT = 512
REJECT = (429, 503)
P50_P99 = (("p50", 50.0), ("p99", 99.0))


class Step(TypedDict, total=False):
    """One rate of the ramp: what it planned and sent, what became of it, what came back meanwhile."""

    factor: float
    rate_rps: float
    planned: int
    client_capped: int  # arrivals not sent: past either cap (open requests, requests in all)
    open_capped: int  # of those, the arrivals that met the cap on open requests (``max_in_flight``)
    sent: int
    ok: int
    rejected: int
    rejected_with_retry_after: int
    errors: int
    outcomes: dict[str, int]
    done_rps: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    error_examples: list[str]


class Capacity(TypedDict, total=False):
    given: bool
    requests: int
    ok: int
    span_s: float
    rps: float | None
    failed: list[str]


class Probe(TypedDict):
    t_s: float
    ttft_ms: float | None
    outcome: str


class Recovery(TypedDict):
    recovery_s: float | None
    limit_ms: float
    probes: list[Probe]


class OverloadMeasure(TypedDict, total=False):
    """What the check measured (readiness.json's measurements.overload)."""

    factors: list[float]
    step_s: float
    max_tokens: int
    max_in_flight: int
    max_requests: int
    not_run: str
    baseline_ttft_ms: list[float]
    baseline_ttft_p50_ms: float
    capacity: Capacity
    capacity_rps: float
    steps: list[Step]
    unfinished_at_drain: int
    client_capped: int
    recovery: Recovery
    recovery_s: float | None


@dataclass(frozen=True)
class OverloadPlan:
    factors: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0)
    step_s: float = 10.0
    capacity_s: float = 10.0
    concurrency: int = 16
    capacity_rps: float | None = None  # given: the capacity phase is not run
    baseline: int = 5
    max_tokens: int = 32
    max_in_flight: int = 256
    max_requests: int = 2000
    recovered_run: int = 3
    recovery_limit_s: float = 60.0
    request_timeout_s: float = 120.0
    drain_s: float = 30.0  # after the recovery phase, for the ramp's requests still open (then closed)

    def check(self) -> None:
        if not self.factors or any(not 0 < f <= 4 for f in self.factors) or list(self.factors) != sorted(self.factors):
            raise InputError("--overload-factors: rising multiples of the capacity, each above 0 and at most 4")
        if not 0.5 <= self.step_s <= 300:
            raise InputError(f"--overload-step {self.step_s:g}: use 0.5 to 300 seconds")
        if not 10 <= self.max_requests <= 100_000:
            raise InputError(f"--overload-max-requests {self.max_requests}: use 10 to 100000 requests")
        if not 0.5 <= self.capacity_s <= 300:
            raise InputError(f"--overload-capacity-time {self.capacity_s:g}: use 0.5 to 300 seconds")
        if not 1 <= self.concurrency <= MAX_IN_FLIGHT:
            raise InputError(f"--overload-concurrency {self.concurrency}: use 1 to {MAX_IN_FLIGHT}")
        if self.capacity_rps is not None and not 0 < self.capacity_rps <= 10_000:
            raise InputError(f"--overload-capacity {self.capacity_rps:g}: use a rate above 0, at most 10000 req/s")
        if not 1 <= self.max_tokens <= 4096:
            raise InputError(f"--overload-tokens {self.max_tokens}: use 1 to 4096 tokens")


@dataclass
class _Sent:
    step: int
    res: StreamResult = field(default_factory=StreamResult)


def _prompt(i: int) -> str:
    return f"Overload check, request {i}: describe a harbour at dawn."


def _outcome(res: StreamResult) -> str:
    if res.ok:
        return "ok"
    if res.status in REJECT:
        return f"rejected_{res.status}"
    return res.error or "unfinished"  # closed by the check after the drain


def _stats(sent: list[_Sent], done: list[StreamResult], span_s: float) -> Step:
    """One step: what was sent in it and what became of it (``sent``), and the completions that came back
    while it lasted, whenever they were sent (``done``: the server's own pace, ``done_rps``)."""
    outcomes = [(_outcome(s.res), s.res) for s in sent]
    out = Counter(o for o, _ in outcomes)
    rejected = [r for o, r in outcomes if o.startswith("rejected_")]
    errors = [r for o, r in outcomes if o != "ok" and not o.startswith("rejected_")]
    ok = [r for o, r in outcomes if o == "ok"]
    d: Step = {"sent": len(sent), "ok": len(ok), "rejected": len(rejected),
               "rejected_with_retry_after": sum(1 for r in rejected if r.retry_after_s is not None),
               "errors": len(errors), "outcomes": dict(sorted(out.items())),
               "done_rps": sum(1 for r in done if r.ok) / span_s if span_s > 0 else None,
               "error_examples": [failure(r) for r in errors[:3]]}
    p = percentiles([t for r in ok if (t := ttft_ms(r)) is not None], P50_P99)
    d["ttft_p50_ms"], d["ttft_p99_ms"] = p.get("p50"), p.get("p99")
    d["e2e_p50_ms"] = percentiles([(r.end_ns - r.sent_ns) / 1e6 for r in ok], P50_P99).get("p50")
    return d


async def _baseline(target: Target, plan: OverloadPlan) -> list[float]:
    out = []
    with target.recorder.phase("overload baseline", "overload", role="baseline", concurrency=1):
        for i in range(plan.baseline):
            res = await target.stream(_prompt(-1 - i), plan.max_tokens, StreamResult())
            if (t := ttft_ms(res)) is not None:
                out.append(t)
    return out


async def _capacity(target: Target, plan: OverloadPlan) -> Capacity:
    """Completions per second of a closed loop of ``concurrency`` streams over ``capacity_s``."""
    deadline = time.monotonic() + plan.capacity_s
    done: list[StreamResult] = []

    async def worker(w: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            res = await target.stream(_prompt(10_000 * (w + 1) + i), plan.max_tokens, StreamResult())
            done.append(res)
            i += 1

    t0 = time.monotonic()
    with target.recorder.phase("overload capacity", "overload", concurrency=plan.concurrency):
        tasks = [asyncio.create_task(worker(w)) for w in range(plan.concurrency)]
        try:
            # the last requests may run past the phase: each is bounded by the client's request timeout, and
            # whatever is still open after that is closed (its result not counted)
            await asyncio.wait(tasks, timeout=plan.capacity_s + plan.request_timeout_s)
        finally:
            target.recorder.cut_reason = "still open past the capacity phase's limit"
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            target.recorder.cut_reason = CUT
    span = time.monotonic() - t0
    ok = [r for r in done if r.ok]
    return {"requests": len(done), "ok": len(ok), "span_s": round(span, 4),
            "rps": len(ok) / span if span > 0 and ok else None,
            "failed": [failure(r) for r in done if not r.ok][:3]}


async def _ramp(target: Target, plan: OverloadPlan, capacity_rps: float,
                log: Any) -> tuple[list[_Sent], list[Step], list[asyncio.Task[Any]], float, int]:
    """Sends the ramp; returns what was sent, the steps, the open tasks, the ramp's end (monotonic s) and its
    start (monotonic ns: step k's window starts k x step_s after it)."""
    sent: list[_Sent] = []
    tasks: list[asyncio.Task[Any]] = []
    steps: list[Step] = []
    open_ = 0

    async def one(s: _Sent, i: int, phase: int | None, intended_ns: int) -> None:
        nonlocal open_
        try:  # recorded in its step's phase, whenever it ends; intended_ns: its arrival time
            await target.stream(_prompt(i), plan.max_tokens, s.res, phase=phase, intended_ns=intended_ns)
        finally:
            open_ -= 1

    rec = target.recorder
    step_ns = int(plan.step_s * 1e9)
    t_start_ns = time.monotonic_ns()
    phase: int | None = None
    try:
        for k, f in enumerate(plan.factors):
            rate = f * capacity_rps
            n = max(1, round(rate * plan.step_s))
            t0_ns = t_start_ns + k * step_ns
            await sleep_until(t0_ns)  # never early: uvloop's timers (and a coarse clock's) wake before their time
            # each step one phase of the bundle, its window: from its first arrival to the next step's
            rec.end(phase, end_ns=t0_ns)
            phase = rec.begin(f"overload ramp {f:g}x", "overload", rate=round(rate, 4),
                              max_concurrency=plan.max_in_flight, factor=f, start_ns=t0_ns)
            capped = open_capped = 0
            for i in range(n):
                arrival_ns = t0_ns + round(i * 1e9 / rate)
                await sleep_until(arrival_ns)  # the record's intended_ns: sent at it or after, never before
                if open_ >= plan.max_in_flight or len(sent) >= plan.max_requests:
                    capped += 1
                    open_capped += open_ >= plan.max_in_flight
                    continue
                s = _Sent(k)
                sent.append(s)
                open_ += 1  # counted when sent, not when its task first runs: a late loop sends overdue arrivals
                # in one go, and the cap must hold for them too
                rec.sent(phase)  # one of the step's requests now, whenever its task first runs
                tasks.append(asyncio.create_task(one(s, len(sent), phase, arrival_ns)))
            steps.append({"factor": f, "rate_rps": round(rate, 4), "planned": n, "client_capped": capped,
                          "open_capped": open_capped})
            log(f"overload: {f:g}x capacity ({rate:.3g} req/s), {open_} requests open")
        end_ns = t_start_ns + len(plan.factors) * step_ns
        await sleep_until(end_ns)
    except BaseException:
        rec.end(phase, interrupted=True)
        raise
    rec.end(phase, end_ns=end_ns)
    return sent, steps, tasks, end_ns / 1e9, t_start_ns


async def _recovery(target: Target, plan: OverloadPlan, base_p50: float, ratio: float,
                    t_end: float) -> Recovery:
    limit = ratio * base_p50
    with target.recorder.phase("overload recovery", "overload", concurrency=1):
        return await _recover(target, plan, limit, t_end)


async def _recover(target: Target, plan: OverloadPlan, limit: float, t_end: float) -> Recovery:
    probes: list[Probe] = []
    run_start: float | None = None
    run = 0
    i = 0
    while time.monotonic() - t_end < plan.recovery_limit_s:
        t_sent = time.monotonic()
        res = await target.stream(_prompt(-100 - i), plan.max_tokens, StreamResult())
        i += 1
        t = ttft_ms(res)
        probes.append({"t_s": round(t_sent - t_end, 4), "ttft_ms": None if t is None else round(t, 3),
                       "outcome": _outcome(res)})
        if t is not None and t <= limit:
            if run == 0:
                run_start = t_sent
            run += 1
            if run >= plan.recovered_run:
                assert run_start is not None
                return {"recovery_s": round(max(0.0, run_start - t_end), 4), "limit_ms": limit, "probes": probes}
        else:
            run, run_start = 0, None
            if t is None:
                await asyncio.sleep(0.1)  # a failed probe (rejected, refused) is not retried at once
    return {"recovery_s": None, "limit_ms": limit, "probes": probes[:200]}


async def run(target: Target, plan: OverloadPlan, recovery_ratio: float,
              log: Any = lambda _m: None) -> OverloadMeasure:
    """Run the check; the measurements as readiness.json keeps them (``status`` is decided by the card)."""
    out: OverloadMeasure = {"factors": list(plan.factors), "step_s": plan.step_s, "max_tokens": plan.max_tokens,
                           "max_in_flight": plan.max_in_flight, "max_requests": plan.max_requests}
    base = await _baseline(target, plan)
    if not base:
        out["not_run"] = f"none of the {plan.baseline} baseline requests got a first token"
        return out
    base_p50 = percentiles(base, P50_P99)["p50"]
    out["baseline_ttft_ms"] = [round(x, 3) for x in base]
    out["baseline_ttft_p50_ms"] = base_p50
    if plan.capacity_rps is not None:
        cap: Capacity = {"given": True, "rps": plan.capacity_rps}
    else:
        log(f"overload: measuring capacity ({plan.concurrency} streams for {plan.capacity_s:g} s)")
        cap = await _capacity(target, plan)
    out["capacity"] = cap
    rps = cap.get("rps")
    if not rps:
        out["not_run"] = f"no capacity measured: no request completed ({'; '.join(cap.get('failed') or [])})"
        return out
    out["capacity_rps"] = rps
    sent, steps, tasks, t_end, t_start_ns = await _ramp(target, plan, float(rps), log)
    try:
        log("overload: ramp over; timing the recovery")
        rec = await _recovery(target, plan, base_p50, recovery_ratio, t_end)
        if tasks:
            await asyncio.wait(tasks, timeout=plan.drain_s)
        open_after = sum(1 for t in tasks if not t.done())
        target.recorder.cut_reason = f"a request of the ramp still open {plan.drain_s:g} s after the recovery"
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        target.recorder.cut_reason = CUT
    step_ns = int(plan.step_s * 1e9)
    for k, st in enumerate(steps):
        lo = t_start_ns + k * step_ns
        done = [s.res for s in sent if s.res.end_ns and lo <= s.res.end_ns < lo + step_ns]
        st.update(_stats([s for s in sent if s.step == k], done, plan.step_s))
    out["steps"] = steps
    out["unfinished_at_drain"] = open_after
    out["client_capped"] = sum(st["client_capped"] for st in steps)
    out["recovery"] = rec
    out["recovery_s"] = rec["recovery_s"]
    return out
