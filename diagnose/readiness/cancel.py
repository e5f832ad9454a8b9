"""The cancellation check: do the engine's running and waiting counts (or busy slots) drop when clients leave?

``streams`` requests are opened at once, each asking for ``max_tokens`` tokens (with ``ignore_eos`` where the
server takes it, so none ends early). Once every stream has its first token (or ``first_token_timeout_s`` has
passed) and they have run together for ``dwell_s``, a share of them is aborted: the client closes their connections, as a user closing a tab or a gateway
timing out does. From then on the engine's own in-flight state is sampled every ``interval_s``:

* **released**: the first sample whose in-flight count is at most what was in flight before the check plus the
  kept streams the client still reads. ``release_s`` is its time after the abort;
* **idle**: once the kept streams have ended (bounded by ``time_limit_s``: those still streaming then are
  closed too and counted in ``kept_unfinished``), the first sample back at the
  count before the check. ``idle_s`` is its time after the last kept stream ended. A count that stays up until
  one more (1-token) request runs an engine step was a stale gauge, not leaked work (``stale_gauge``: the
  reading it stayed at; vLLM refreshes its gauges only when a step runs).

A count still above either bound after ``bound_s`` is leaked work: the engine goes on generating for clients that
left (``leaked``: how many requests; on llama.cpp the slots that stay busy). The kept streams' throughput is
reported before and after the abort (tokens per second per stream): freed capacity should not slow them.

Everything is bounded: at most ``MAX_STREAMS`` streams, and every wait has its limit.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from diagnose.errors import InputError
from diagnose.probes.sse import StreamResult
from diagnose.readiness.record import CUT
from diagnose.readiness.target import State, Target, failure

MAX_STREAMS = 64
MAX_TOKENS = 8192
RETRY_FACTOR = 4
MAX_SAMPLES = 2000  # in-flight samples kept in readiness.json (the first ones; the judgement uses them all)


@dataclass(frozen=True)
class CancelPlan:
    streams: int = 8
    abort_share: float = 0.5
    max_tokens: int = 512
    first_token_timeout_s: float = 30.0
    time_limit_s: float = 60.0  # for the kept streams to end
    interval_s: float = 0.05
    dwell_s: float = 1.0  # all streams running together before the abort: the kept streams' rate before it

    def check(self) -> None:
        if not 2 <= self.streams <= MAX_STREAMS:
            raise InputError(f"--cancel-streams {self.streams}: use 2 to {MAX_STREAMS}")
        if not 0 < self.abort_share <= 1:
            raise InputError(f"--abort-share {self.abort_share:g}: use a share above 0, at most 1")
        if not 0 <= self.dwell_s <= 30:  # also refuses NaN
            raise InputError(f"--cancel-dwell {self.dwell_s:g}: use 0 to 30 seconds")
        if not 8 <= self.max_tokens <= MAX_TOKENS:
            raise InputError(f"--cancel-tokens {self.max_tokens}: use 8 to {MAX_TOKENS} tokens")

    @property
    def n_abort(self) -> int:
        return max(1, min(self.streams, round(self.streams * self.abort_share)))


def _prompt(i: int) -> str:
    return f"Readiness check, stream {i}: write a long story about a lighthouse keeper and the sea."


# a rate needs a window and tokens enough to mean one: kept streams that ended 1 ms after the abort, a few
# buffered chunks arriving at once, read "330,687 tok/s each" on a fast host
RATE_MIN_S = 0.2
RATE_MIN_TOKENS = 8


def _rate(res: StreamResult, lo_ns: int, hi_ns: int) -> float | None:
    """Tokens per second that ``res`` received in (lo_ns, hi_ns]; None over less than RATE_MIN_S or with fewer
    than RATE_MIN_TOKENS tokens."""
    if (hi_ns - lo_ns) / 1e9 < RATE_MIN_S:
        return None
    n = sum(k for t, k in zip(res.t_ns, res.tok, strict=False) if lo_ns < t <= hi_ns)
    return n / ((hi_ns - lo_ns) / 1e9) if n >= RATE_MIN_TOKENS else None


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


class StreamTimes(TypedDict):
    """One stream as the check saw it (seconds from the check's start; None: it never got there)."""

    sent_s: float | None
    first_token_s: float | None
    end_s: float | None
    tokens: int
    ended: bool


def _times(res: StreamResult, t0_ns: int) -> StreamTimes:
    """One stream as the check saw it, in seconds from the check's start: sent, first token, end; its tokens."""
    def s(ns: int | None) -> float | None:
        return round((ns - t0_ns) / 1e9, 4) if ns else None
    return {"sent_s": s(res.sent_ns), "first_token_s": s(res.t_ns[0] if res.t_ns else None),
            "end_s": s(res.end_ns), "tokens": sum(res.tok), "ended": res.done}


async def _first_tokens(results: list[StreamResult], tasks: list[asyncio.Task[StreamResult]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(r.t_ns or t.done() for r, t in zip(results, tasks, strict=True)):
            return
        await asyncio.sleep(0.01)


async def _sample_until(target: Target, t0: float, samples: list[State], bound: Any, limit_s: float,
                        interval_s: float) -> State | None:
    """Sample until a reading is at most ``bound()`` (returned), or ``limit_s`` passed (None)."""
    deadline = time.monotonic() + limit_s
    while True:
        s = await target.state(t0)
        if s is not None:
            samples.append(s)
            if s.in_flight <= bound():
                return s
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(interval_s)


async def run(target: Target, plan: CancelPlan, bound_s: float, log: Any = lambda _m: None) -> dict[str, Any]:
    """Run the check; the measurements as readiness.json keeps them (``status`` is decided by the card).

    When too few streams were still open at the abort (none failed: they ended first), the check is run once
    more with ``RETRY_FACTOR`` times the tokens (at most ``MAX_TOKENS``): on a busy host a client stalled for a
    second or more while the server generated (measured on 2 shared cores beside vLLM's CPU build: every
    process on the host, not only the client, went unscheduled, the client for 0.8-1.7 s), so the first stream
    had all its tokens before the last was sent. ``first_try`` keeps what the first try saw."""
    if target.source is None:
        return _head(target, plan, bound_s) | {
            "not_run": ("the server publishes no in-flight state diagnose reads (llama.cpp's /slots or its "
                        "llamacpp:requests_processing gauge, vLLM's vllm:num_requests_running)")}
    rec = target.recorder
    with rec.phase("cancellation", "cancellation", concurrency=plan.streams, max_tokens=plan.max_tokens):
        out = await _attempt(target, plan, bound_s, log)
    if out.get("too_soon") and plan.max_tokens < MAX_TOKENS:
        more = replace(plan, max_tokens=min(MAX_TOKENS, plan.max_tokens * RETRY_FACTOR))
        log(f"cancellation: {out['too_soon']}; once more with {more.max_tokens} tokens a stream")
        t0 = time.monotonic()
        base = out.get("before") or {}
        samples: list[State] = []
        await _sample_until(target, t0, samples, lambda: int(base.get("in_flight") or 0), bound_s, plan.interval_s)
        first = {k: out[k] for k in ("max_tokens", "too_soon", "first_token_ok", "stream_times") if k in out}
        with rec.phase("cancellation, second try", "cancellation", concurrency=more.streams,
                       max_tokens=more.max_tokens):
            out = await _attempt(target, more, bound_s, log) | {"first_try": first}
    return out


def _head(target: Target, plan: CancelPlan, bound_s: float) -> dict[str, Any]:
    return {"streams": plan.streams, "abort_share": plan.abort_share, "max_tokens": plan.max_tokens,
            "source": target.source, "bound_s": bound_s}


async def _attempt(target: Target, plan: CancelPlan, bound_s: float, log: Any) -> dict[str, Any]:
    out = _head(target, plan, bound_s)
    t0 = time.monotonic()
    t0_ns = time.monotonic_ns()
    base = await target.state(t0)
    if base is None:
        out["not_run"] = f"its in-flight state ({target.source}) could not be read"
        return out
    out["before"] = base.as_dict()
    results = [StreamResult() for _ in range(plan.streams)]
    tasks = [asyncio.create_task(target.stream(_prompt(i), plan.max_tokens, r)) for i, r in enumerate(results)]
    samples: list[State] = []
    try:
        await _first_tokens(results, tasks, plan.first_token_timeout_s)
        t_ready_ns = time.monotonic_ns()
        await asyncio.sleep(plan.dwell_s)
        open_ = [i for i, (r, t) in enumerate(zip(results, tasks, strict=True)) if r.t_ns and not t.done()]
        victims = open_[:plan.n_abort]
        out["first_token_ok"] = sum(1 for r in results if r.t_ns)
        failed = [r for r in results if not r.ok]
        # the aborted streams, and one kept stream still streaming beside them (unless all are aborted)
        wanted = min(plan.streams, plan.n_abort + 1)
        if len(open_) < wanted and not failed:
            out["too_soon"] = (f"{len(open_)} of {plan.streams} streams still open {plan.dwell_s:g} s after the "
                               f"last first token ({wanted} wanted): the others had ended")
        if not victims or (len(open_) < wanted and not failed):
            why = [failure(r) for r in failed][:3]
            out["not_run"] = ("too few streams were still open after their first tokens to abort" + (
                f" ({len(failed)} failed: {'; '.join(why)})" if why else
                f": {out['too_soon']}; raise --cancel-tokens"))
            return out
        at = await target.state(t0)
        if at is not None:
            out["at_abort"] = at.as_dict()
        target.recorder.cut_reason = "aborted by the cancellation check after its first tokens"
        for i in victims:
            tasks[i].cancel()
        await asyncio.gather(*(tasks[i] for i in victims), return_exceptions=True)
        t_abort_ns = time.monotonic_ns()
        t_abort = time.monotonic()
        log(f"cancellation: aborted {len(victims)} of {plan.streams} streams after their first tokens")
        kept = [i for i in range(plan.streams) if i not in victims]

        def kept_open() -> int:
            return sum(1 for i in kept if not tasks[i].done())

        rel = await _sample_until(target, t0, samples, lambda: base.in_flight + kept_open(), bound_s, plan.interval_s)
        out["aborted"], out["kept"] = len(victims), len(kept)
        out["release_s"] = round(rel.t_s - (t_abort - t0), 4) if rel is not None else None
        if kept:
            await asyncio.wait([tasks[i] for i in kept], timeout=plan.time_limit_s)
        out["kept_unfinished"] = kept_open()  # still streaming after time_limit_s: closed now, as the aborted were
        cut_ns = time.monotonic_ns()
        target.recorder.cut_reason = f"a kept stream still streaming {plan.time_limit_s:g} s after the abort"
        for i in kept:
            tasks[i].cancel()
        await asyncio.gather(*(tasks[i] for i in kept), return_exceptions=True)
        t_end = time.monotonic()
        idle = await _sample_until(target, t0, samples, lambda: base.in_flight, bound_s, plan.interval_s)
        out["idle_s"] = round(idle.t_s - (t_end - t0), 4) if idle is not None else None
        if idle is None:
            # vLLM refreshes its gauges only when a step runs: after aborts with nothing left to run they keep
            # the last step's counts (vllm#22545, #29928). One 1-token request runs a step: in-flight back to the
            # count before the check then means the work was released and only the gauge was stale.
            stale_from = samples[-1].as_dict() if samples else None
            await target.stream("ping", 1, StreamResult(), tags={"part": "ping"})
            again = await _sample_until(target, t0, samples, lambda: base.in_flight, bound_s, plan.interval_s)
            if again is not None:
                out["stale_gauge"] = stale_from
        last = samples[-1] if samples else None
        if idle is None and "stale_gauge" not in out and last is not None:
            out["leaked"] = max(0, last.in_flight - base.in_flight)
            out["leaked_state"] = last.as_dict()
        elif rel is None and samples:
            worst = max(samples, key=lambda s: s.in_flight)
            out["leaked_during"] = worst.as_dict()
        kres = [results[i] for i in kept]
        out["kept_failed"] = [failure(r) for r in kres if not r.ok and r.end_ns and r.end_ns < cut_ns][:5]
        out["kept_ok"] = sum(1 for r in kres if r.ok and r.done)
        ends = [r.end_ns if r.done else cut_ns for r in kres]
        end_ns = max(ends) if ends else t_abort_ns
        out["kept_tps_per_stream_before"] = _mean([_rate(r, t_ready_ns, t_abort_ns) for r in kres if r.t_ns])
        out["kept_tps_per_stream_after"] = _mean([_rate(r, t_abort_ns, e) for r, e in zip(kres, ends, strict=True)])
        after = sum(k for r in kres for t, k in zip(r.t_ns, r.tok, strict=False) if t > t_abort_ns)
        out["kept_tps_after"] = (after / ((end_ns - t_abort_ns) / 1e9)
                                 if (end_ns - t_abort_ns) / 1e9 >= RATE_MIN_S and after >= RATE_MIN_TOKENS else None)
        out["aborted_tokens"] = sum(sum(results[i].tok) for i in victims)
    finally:
        target.recorder.cut_reason = CUT
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        out["stream_times"] = [_times(r, t0_ns) for r in results]
        out["samples"] = [s.as_dict() for s in samples[:MAX_SAMPLES]]
    return out
