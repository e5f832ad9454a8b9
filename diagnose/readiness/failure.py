"""The failure and recovery check (``--launch`` only): the server crashes mid-run and is started again. How long
until it serves, how many requests are lost, and do the clients' retries stay bounded?

``workers`` clients each send requests back to back (``max_tokens`` tokens), as a well-behaved SDK does: a
failed attempt (refused, reset, timed out, 5xx, 429) is retried after a capped exponential backoff with full
jitter (``backoff_base_s`` doubling up to ``backoff_cap_s``, seeded), at most ``max_retries`` times; then the
request is given up (lost). After ``before_s`` of that, every process of the server is killed (SIGKILL: a crash,
no graceful drain); ``down_s`` later the same command is started again, and the load goes on until
``after_s`` past the first completion after the crash (or ``recover_limit_s`` after the crash).

Measured (seconds on one monotonic clock, from the crash):

* ``restart_healthy_s``: from the new start to healthy (``GET /health`` 200, or ``/v1/models`` without it);
* ``recovery_s``: from the crash to the first token of a probe: from healthy, one request at a time without
  backoff (0.1 s after a failure), so the clients' backoff does not time it late;
* ``health_gap_s``: from healthy to that first token: a server that says healthy before it serves has a load
  balancer send it traffic too early;
* ``in_flight_at_crash`` (requests with an attempt sent before every process was dead that failed after the kill
  began), ``lost`` (given up after every retry) and ``recovered_by_retry`` (failed at least once, then completed);
* ``outage_attempts_per_s`` and ``retry_amplification``: attempts per second between the crash and the
  recovery over the completions per second before the crash: what the clients' retries cost a recovering
  server (a retry storm multiplies it);
* the TTFT P50/P99 before the crash and after the recovery (``after_s``), apart.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from diagnose.errors import InputError
from diagnose.probes.sse import StreamResult
from diagnose.readiness.target import Target, ttft_ms
from diagnose.requests import percentiles

P50_P99 = (("p50", 50.0), ("p99", 99.0))


class FailureMeasure(TypedDict, total=False):
    """What the check measured (readiness.json's measurements.failure; the module docstring defines each)."""

    workers: int
    max_tokens: int
    max_retries: int
    backoff_base_s: float
    backoff_cap_s: float
    before_s: float
    down_s: float
    restart_failed: str
    t_crash_s: float
    kill_s: float
    completed_before: int
    rps_before: float | None
    ttft_before_p50_ms: float | None
    ttft_before_p99_ms: float | None
    in_flight_at_crash: int
    restart_healthy_s: float | None
    recovery_s: float | None
    health_gap_s: float | None
    outage_attempts: int
    outage_failures: dict[str, int]
    outage_attempts_per_s: float | None
    retry_amplification: float | None
    requests_after_crash: int
    lost: int
    recovered_by_retry: int
    lost_in_flight_at_crash: int
    ttft_after_p50_ms: float | None
    ttft_after_p99_ms: float | None
    completed_after: int
    attempts_per_request_max: int


@dataclass(frozen=True)
class FailurePlan:
    workers: int = 4
    max_tokens: int = 32
    before_s: float = 5.0
    after_s: float = 10.0
    down_s: float = 1.0
    max_retries: int = 5
    backoff_base_s: float = 0.25
    backoff_cap_s: float = 4.0
    recover_limit_s: float = 660.0  # after the crash: the restart's startup timeout and a minute
    seed: int = 37

    def check(self) -> None:
        if not 1 <= self.workers <= 64:
            raise InputError(f"--failure-clients {self.workers}: use 1 to 64")
        if not 0.5 <= self.before_s <= 300:
            raise InputError(f"--failure-before {self.before_s:g}: use 0.5 to 300 seconds")
        if not 1 <= self.max_tokens <= 4096:
            raise InputError(f"--failure-tokens {self.max_tokens}: use 1 to 4096 tokens")


@dataclass
class _Attempt:
    t_s: float  # sent, from the check's start
    t_end_s: float  # its answer, failure or last byte
    ok: bool
    what: str  # ok, or the failure's category (refused, reset, http_5xx, ...)


@dataclass
class _Req:
    attempts: list[_Attempt] = field(default_factory=list)
    ok: bool = False
    given_up: bool = False
    ttft_ms: float | None = None
    t_first_token_s: float | None = None


def _prompt(w: int, i: int) -> str:
    return f"Failure check, client {w}, request {i}: name three lighthouses."


async def _probe(target: Target, plan: FailurePlan, t_crash: float, now: Callable[[], float]) -> float | None:
    """From healthy, one request at a time without backoff (0.1 s after a failure) until one gets its first
    token: when that was (the clients' own retries sleep in their backoff and would time it late)."""
    while now() - t_crash < plan.recover_limit_s:
        t_sent = now()
        res = await target.stream("Failure check: are you back?", 1, StreamResult(), tags={"part": "probe"})
        t = ttft_ms(res)
        if t is not None:
            return t_sent + t / 1e3
        await asyncio.sleep(0.1)
    return None


async def run(target: Target, plan: FailurePlan, crash: Callable[[], None], restart: Callable[[], float],
              log: Any = lambda _m: None) -> FailureMeasure:
    """Run the check; ``crash()`` kills the server, ``restart()`` starts it again and returns the seconds it
    took to be healthy (raises when it is not). Both block: they run in a thread while the clients go on."""
    rng = random.Random(plan.seed)
    t0 = time.monotonic()
    reqs: list[_Req] = []
    stop = asyncio.Event()

    def now() -> float:
        return time.monotonic() - t0

    async def client(w: int) -> None:
        i = 0
        while not stop.is_set():
            r = _Req()
            reqs.append(r)
            i += 1
            while not stop.is_set():
                t_sent = now()
                res = await target.stream(_prompt(w, i), plan.max_tokens, StreamResult(),
                                          tags={"part": "client", "client": w, "request": i,
                                                "retry": len(r.attempts)})
                ok = res.ok
                r.attempts.append(_Attempt(t_sent, now(), ok, "ok" if ok else (res.error or "error")))
                if ok:
                    r.ok, r.ttft_ms = True, ttft_ms(res)
                    r.t_first_token_s = t_sent + (r.ttft_ms or 0.0) / 1e3
                    break
                if len(r.attempts) > plan.max_retries:
                    r.given_up = True
                    break
                delay = rng.uniform(0, min(plan.backoff_cap_s, plan.backoff_base_s * 2 ** (len(r.attempts) - 1)))
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass

    # the whole check one phase of the bundle: the clients' attempts (tagged with their client, request and retry:
    # 0 for a first attempt) and the probe's, across the crash and the restart
    phase = target.recorder.begin("failure", "failure", concurrency=plan.workers)
    tasks = [asyncio.create_task(client(w)) for w in range(plan.workers)]
    out: FailureMeasure = {"workers": plan.workers, "max_tokens": plan.max_tokens, "max_retries": plan.max_retries,
                           "backoff_base_s": plan.backoff_base_s, "backoff_cap_s": plan.backoff_cap_s,
                           "before_s": plan.before_s, "down_s": plan.down_s}
    done = False
    try:
        await asyncio.sleep(plan.before_s)
        t_crash = now()
        log("failure: killing the server")
        await asyncio.to_thread(crash)
        t_killed = now()
        await asyncio.sleep(plan.down_s)
        t_restart = now()
        log("failure: starting the server again")
        try:
            healthy_s = await asyncio.to_thread(restart)
        except Exception as e:  # noqa: BLE001 - the restart's failure is the measurement (LaunchError's line)
            out["restart_failed"] = str(e).splitlines()[0][:300]
            healthy_s = None
        t_healthy = t_restart + healthy_s if healthy_s is not None else None
        first = await _probe(target, plan, t_crash, now) if healthy_s is not None else None
        if first is not None:
            await asyncio.sleep(max(0.0, first + plan.after_s - now()))
        done = True
    finally:
        stop.set()
        _, pending = await asyncio.wait(tasks, timeout=30.0)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        target.recorder.end(phase, interrupted=not done)
    t_end = now()
    before = [r for r in reqs if r.ok and r.attempts[0].t_s < t_crash and len(r.attempts) == 1]
    ttft_before = percentiles([r.ttft_ms for r in before if r.ttft_ms is not None], P50_P99)
    rps_before = len(before) / t_crash if t_crash > 0 else None
    out["t_crash_s"] = round(t_crash, 4)
    out["completed_before"] = len(before)
    out["rps_before"] = rps_before
    out["ttft_before_p50_ms"], out["ttft_before_p99_ms"] = ttft_before.get("p50"), ttft_before.get("p99")
    # cut by the crash: an attempt sent before every process was dead that failed after the kill began (one
    # that finished while the processes were being found and signalled was not in flight when they died)
    cut = {i for i, r in enumerate(reqs)
           if any(a.t_s < t_killed and a.t_end_s >= t_crash and not a.ok for a in r.attempts)}
    out["in_flight_at_crash"] = len(cut)
    out["kill_s"] = round(t_killed - t_crash, 4)
    out["restart_healthy_s"] = round(healthy_s, 4) if healthy_s is not None else None
    out["recovery_s"] = round(first - t_crash, 4) if first is not None else None
    out["health_gap_s"] = (round(max(0.0, first - t_healthy), 4) if first is not None and t_healthy is not None
                           else None)
    end_outage = first if first is not None else t_end
    outage = [a for r in reqs for a in r.attempts if t_crash <= a.t_s < end_outage]
    span = end_outage - t_crash
    out["outage_attempts"] = len(outage)
    out["outage_failures"] = dict(sorted(Counter(a.what for a in outage if not a.ok).items()))
    out["outage_attempts_per_s"] = len(outage) / span if span > 0 else None
    out["retry_amplification"] = (out["outage_attempts_per_s"] / rps_before
                                  if out["outage_attempts_per_s"] is not None and rps_before else None)
    out["requests_after_crash"] = sum(1 for i, r in enumerate(reqs)
                                      if i in cut or any(a.t_s >= t_crash for a in r.attempts))
    out["lost"] = sum(1 for r in reqs if r.given_up)
    out["recovered_by_retry"] = sum(1 for r in reqs if r.ok and len(r.attempts) > 1)
    out["lost_in_flight_at_crash"] = sum(1 for i in cut if not reqs[i].ok)
    after = [r for r in reqs if r.ok and first is not None and r.attempts[-1].t_s >= first]
    ttft_after = percentiles([r.ttft_ms for r in after if r.ttft_ms is not None], P50_P99)
    out["ttft_after_p50_ms"], out["ttft_after_p99_ms"] = ttft_after.get("p50"), ttft_after.get("p99")
    out["completed_after"] = len(after)
    out["attempts_per_request_max"] = max((len(r.attempts) for r in reqs), default=0)
    return out
