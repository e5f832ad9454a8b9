"""The load probe: streams requests at a workload and records what the client saw of each one.

Closed loop (``concurrency``): C workers, each sending its next request when the previous one ends.
Open loop (``rate``): arrivals at R/s with Poisson, gamma (``burstiness`` = shape; < 1 is burstier) or constant
gaps, optionally capped at ``max_concurrency`` in flight. Each level of a sweep is one phase. The first
``warmup_requests`` of each phase are marked ``warmup`` (kept on disk, left out of statistics).

Streams written (docs/ARCHITECTURE.md, fields in docs/metrics.md): ``requests`` and ``chunks`` (one record
each per finished request, flushed every 0.1 s and on cancellation; in-flight requests are recorded as
``error="incomplete"``), ``phases``, ``client_health``. Server options are negotiated once before the run:
``stream_options.include_usage`` (+ ``continuous_usage_stats``, exact tokens per chunk) and ``ignore_eos`` are
dropped one by one when the server answers 400.

Loop stalls (issue 18; benchmarks/results/client_stall.md): nothing on the event loop waits for the disk
during a capture. Every stream write (health samples and phase records too) is queued for one I/O thread
(a write() can block for hundreds of ms when the kernel throttles writers or the journal commits), records
are serialised on the loop a few per turn, more per turn (up to ``FLUSH_BUDGET_MS``) only when a backlog
builds, and a phase's end drains the rest the same way instead of in one go. At most ``SEND_BATCH``
requests are set up per turn, fewer when their measured set-up time would exceed ``SEND_BUDGET_MS`` (a closed
loop's wave or a phase's start otherwise sets up hundreds in one).
The collector's oldest generation never runs automatically during the capture (set-up objects are frozen
first, and what survives each 0.1 s health tick after them); it runs at phase boundaries, when no request is
in flight. The health stream names the cause of any stall it sees
(probes/load_monitor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import random
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from diagnose.capture.redact import Redactor, excerpt, scrub_text
from diagnose.capture.workload import Phase, Replay, ReplayRequest, WorkloadSpec
from diagnose.errors import InputError
from diagnose.io.writer import StreamWriter, serialize_records
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec
from diagnose.probes.http_client import CLIENT_LIMIT, HttpClient, RequestFailed
from diagnose.probes.load_monitor import Monitor, RunningStats
from diagnose.probes.load_options import workload_from_options
from diagnose.probes.prompts import Prompt, PromptFactory
from diagnose.probes.sessions import Conversation, TaskPlan, Turn, run_task
from diagnose.probes.sse import StreamResult, now_ns, sleep_until

# a replayed request: (its index in the workload file, the loop it belongs to, the recorded request)
ReplayItem = tuple[int, int, ReplayRequest]

CONNECT_ERRORS = ("refused", "connect")
ABORT_AFTER_CONNECT_FAILURES = 50  # in a row, with no success between: the server is gone
# the same answer (HTTP 401, 429, 500, a malformed stream, a timeout...) to this many requests in a row, with no
# success between: every further request would get it too, so the load stops (issue 12, defect 11: an
# all-401 server otherwise took 20 thousand requests in 4 s)
ABORT_AFTER_SAME_FAILURES = 50
MAX_RETRY_AFTER_S = 10.0  # a Retry-After (429/503) pauses new requests this long at most
STOP_GRACE_S = 5.0  # after an outside stop, in-flight requests get this long before being cancelled
FLUSH_SLICE = 4  # chunk records serialised per event-loop turn by the periodic flush (~0.1-0.3 ms at 256 tokens)
FLUSH_BACKLOG = 64  # records waiting: above this a turn serialises slices until FLUSH_BUDGET_MS is spent
FLUSH_BUDGET_MS = 0.5
SEND_BATCH = 16  # requests set up and sent per event-loop turn at most (the rest wait a turn: _send_gate)
SEND_BUDGET_MS = 1.0  # ... and fewer when their measured set-up time would take longer than this in one turn
SETUP_MS_START = 0.5  # a request's set-up time assumed until one is measured (a new connection's is ~0.3-0.9 ms)


def _spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]) -> None:
    """Start one request of an open loop or replay; ``tasks`` holds it while it runs."""
    task = asyncio.ensure_future(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _run_workers(worker: Callable[[], Coroutine[Any, Any, None]], n: int) -> None:
    """Runs ``n`` closed-loop workers to their end, started ``SEND_BATCH`` per loop turn: every worker's first
    step in one turn (256 at a phase's start) held the loop for 10 ms and more before any request was sent."""
    tasks: list[asyncio.Task[None]] = []
    try:
        for i in range(n):
            tasks.append(asyncio.ensure_future(worker()))
            if i % SEND_BATCH == SEND_BATCH - 1:
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
    except BaseException:
        await _cancel_all(tasks)
        raise


async def _cancel_all(tasks: Collection[asyncio.Task[Any]]) -> None:
    """End the tasks still running (an open loop's or replay's requests, a closed loop's workers: a stop, an
    error) and wait for them."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)

class LoadProbe:
    name = "load"

    def __init__(self, spec: WorkloadSpec, *, progress: bool | None = None) -> None:
        self.spec = spec
        self.progress = progress

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        if not self.spec.phases:
            return False, "workload has no phases"
        return True, ""

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        return await _LoadRun(self.spec, ctx, self.progress).run()


@dataclasses.dataclass
class _Quota:
    """A closed-loop phase's warm-up and measured sends (requests; tasks with --turns), shared by its workers."""

    warm_left: int
    measured_left: int | None  # None: as many as the phase's duration allows

    def take(self) -> bool | None:
        """True: send a warm-up one; False: a measured one; None: the phase has sent all it should."""
        if self.warm_left > 0:
            self.warm_left -= 1
            return True
        if self.measured_left is None:
            return False
        if self.measured_left > 0:
            self.measured_left -= 1
            return False
        return None


def _gap_fn(spec: WorkloadSpec, rate: float, rng: random.Random) -> Any:
    if spec.arrival == "constant":
        return lambda: 1.0 / rate
    if spec.arrival == "gamma" and spec.burstiness != 1.0:
        k = max(1e-3, spec.burstiness)
        return lambda: rng.gammavariate(k, 1.0 / (rate * k))
    return lambda: rng.expovariate(rate)


class _LoadRun:
    def __init__(self, spec: WorkloadSpec, ctx: CaptureContext, progress: bool | None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.client = HttpClient(ctx.target.url, headers=ctx.target.headers(),
                                 request_timeout_s=spec.request_timeout_s)
        self.client.store_text = spec.store_text
        self.path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        self.prompts = PromptFactory(spec.input_tokens, shared_prefix_fraction=spec.shared_prefix_fraction,
                                     seed=spec.seed, api=spec.api)
        self.token = os.urandom(4).hex()
        self.seq = 0
        self.stats = RunningStats()
        self.stopping = False
        self.abort_reason = ""
        self.consecutive_connect_failures = 0
        self.same_failures = 0  # failures in a row with one answer (fail_kind), no success between
        self.fail_kind = ""
        self.answers: Counter[str] = Counter()  # failures by what the server answered ("HTTP 401", "timeout")
        self.last_failure = ""
        self.hold_until_ns = 0  # no new request before this (the server's Retry-After)
        self.redactor = Redactor(ctx.target.secrets())
        self.counts: Counter[str] = Counter()
        self.options: dict[str, Any] = {}
        self.model: str | None = None
        self._req_buf: list[dict[str, Any]] = []
        self._chunk_buf: list[dict[str, Any]] = []
        self.w_requests = ctx.bundle.stream("requests", "one record per finished request (load probe)")
        self.w_chunks = ctx.bundle.stream("chunks", "content-chunk arrival times and tokens per request")
        self.w_phases = ctx.bundle.stream("phases", "one record per workload phase (sweep level)")
        self.w_health = ctx.bundle.stream("client_health", "load client self-check samples every 0.1 s")
        self.monitor = Monitor(self.stats, self.client.in_flight, self._write_health, self._tick, progress)
        self._flush_scheduled = False
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diagnose-load-io")
        self._io_last: Future[None] | None = None
        self._gc_deferred = False  # automatic oldest-generation collections are off (the capture runs)
        self._turn_sends = 0  # requests sent in this loop turn (_send_gate)
        self._turn_armed = False
        self._gate_waiters: deque[asyncio.Future[None]] = deque()
        self.setup_ms = SETUP_MS_START  # moving average of a request's set-up time on the loop (_send_gate)
        self.notes: dict[str, Any] = {}
        self.cut_reason = ""  # why in-flight requests are being cancelled, when not an outside stop
        # a replayed session's turns in the file: its requests' planned "turns", so a conversation replayed
        # is measured as a task (diagnose/normalize/tasks.py) as a synthetic one is
        self.session_turns: Counter[str] = Counter()
        self.turn_of: dict[int, int] = {}  # file index -> its turn in its session (file order), where not given
        for i, r in enumerate(spec.replay.requests if spec.replay else ()):
            if r.session is not None:
                self.turn_of[i] = r.turn if r.turn is not None else self.session_turns[r.session]
                self.session_turns[r.session] += 1

    # -- bookkeeping ---------------------------------------------------------------------------------
    def flush(self) -> None:
        """Writes every buffered record now and waits until it is on disk, blocking the loop (the last resort:
        a cancelled drain; :meth:`drain` is the normal way)."""
        for buf, w in ((self._req_buf, self.w_requests), (self._chunk_buf, self.w_chunks)):
            if buf:
                self._write(w, buf[:])
                buf.clear()
        if self._io_last is not None:
            self._io_last.result()  # a write error (disk full) surfaces here
            self._io_last = None

    async def drain(self, wait_io: bool = False) -> None:
        """Serialises every buffered record in budgeted slices, one per loop turn (end of a phase), and with
        ``wait_io`` waits (without blocking the loop) until the I/O thread has written them (end of the run).
        Cancelled meanwhile, it falls back to :meth:`flush` so no record is lost."""
        try:
            while self._req_buf or self._chunk_buf:
                self._slices(force_budget=True)
                await asyncio.sleep(0)
            if wait_io and self._io_last is not None:
                fut, self._io_last = self._io_last, None
                await asyncio.wrap_future(fut)  # a write error (disk full) surfaces here
        except asyncio.CancelledError:
            self.flush()
            raise

    def _tick(self) -> None:
        """Every health tick (0.1 s): the periodic flush, and during a phase what survived the tick is frozen,
        so the collector's young generations only ever scan what the last tick allocated. Unfrozen, they
        scanned every in-flight request's objects again and again: 0.2-4 ms pauses, ~150 a minute at
        c=256 (benchmarks/results/client_stall.md); frozen, ~30 a minute of at most 0.7 ms. Requests mostly
        die by reference count, frozen or not; a cycle that becomes garbage after its tick waits for the
        phase's end, where everything is unfrozen and collected (_phase_end)."""
        if self._gc_deferred:
            gc.freeze()
        self.flush_soon()

    def flush_soon(self) -> None:
        """The periodic flush: serialised in slices of ``FLUSH_SLICE`` records per event-loop turn, written
        by an I/O thread.

        Requests that finish together (a closed-loop wave) leave hundreds of chunk records whose
        serialisation takes 5-10 ms at concurrency 256; done in one go, that stall delays every chunk
        arriving meanwhile and was the TTFT error P99 (benchmarks/results/client_bench.md). Between slices
        the loop polls the sockets, so no stamp waits for more than one slice; the file write itself (which
        can block for ms when the kernel throttles writers) runs on the I/O thread and releases the GIL.
        When records come faster than a slice per turn (thousands of requests per second, e.g. a server
        that fails every request at once) a turn takes slices until ``FLUSH_BUDGET_MS`` is spent, so the
        backlog stays bounded instead of piling up for one long flush at the end of the phase."""
        if not self._flush_scheduled and (self._req_buf or self._chunk_buf):
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_slice)

    def _flush_slice(self) -> None:
        self._flush_scheduled = False
        self._slices(force_budget=False)
        self.flush_soon()

    def _slices(self, force_budget: bool) -> None:
        """One turn's share of the buffered records: one slice, or slices until the budget is spent when a
        backlog built up (or ``force_budget``: the end-of-phase drain)."""
        t0 = time.perf_counter_ns()
        budget = force_budget or len(self._chunk_buf) + len(self._req_buf) > FLUSH_BACKLOG
        deadline = t0 + int(FLUSH_BUDGET_MS * 1e6)
        n = 0
        while True:
            for buf, w, k in ((self._chunk_buf, self.w_chunks, FLUSH_SLICE),
                              (self._req_buf, self.w_requests, FLUSH_SLICE * 4)):
                if buf:
                    part = buf[:k]
                    del buf[:k]
                    self._write(w, part)
                    n += len(part)
            if not budget or not (self._chunk_buf or self._req_buf) or time.perf_counter_ns() >= deadline:
                break
        if n:
            self.monitor.note("flush", (time.perf_counter_ns() - t0) / 1e6, n)

    def _write(self, w: StreamWriter, records: list[dict[str, Any]]) -> None:
        """Serialises here (orjson holds the GIL: on another thread it would stall this loop anyway) and
        queues the bytes for the single I/O thread, which keeps them in order."""
        self._io_last = self._io.submit(w.write_serialized, serialize_records(records), len(records))

    def _write_health(self, record: dict[str, Any]) -> None:
        """A health sample: queued for the I/O thread like every other write, so a disk that blocks a write()
        never stalls the loop the sample measures."""
        self._write(self.w_health, [record])

    def _status(self, interrupted: bool) -> ProbeStatus:
        ok, failed = self.counts["ok"], sum(v for k, v in self.counts.items() if k not in ("ok", "incomplete"))
        errors = {k: v for k, v in sorted(self.counts.items()) if k != "ok"}
        detail: dict[str, Any] = {"requests_ok": ok, "requests_failed": failed,
                                  "requests_incomplete": self.counts["incomplete"], "errors_by_category": errors,
                                  "model": self.model, "api": self.spec.api, "request_options": self.options,
                                  **self.notes}
        if interrupted:
            detail["interrupted"] = True
        if self.abort_reason:
            return ProbeStatus("load", "failed", self.abort_reason, detail)
        if ok == 0:
            what = ", ".join(f"{v} {k}" for k, v in errors.items()) or "no requests were sent"
            if self.answers:  # what the server answered, as the last stderr line and the report say it
                what += ": " + ", ".join(f"{v} {'answered ' if k.startswith('HTTP') else ''}{k}"
                                         for k, v in self.answers.most_common())
                what += f"; last: {self.last_failure}" if self.last_failure else ""
                if self.notes.get("retry_after_holds"):
                    what += f"; Retry-After honoured {self.notes['retry_after_holds']} time(s)"
            return ProbeStatus("load", "failed", f"no request succeeded ({what})", detail)
        reason = f"{ok} ok, {failed} failed" + (" (stopped early)" if interrupted else "")
        return ProbeStatus("load", "ok", reason, detail)

    # -- request ------------------------------------------------------------------------------------
    def _body(self, text: str, max_tokens: int | None = None,
              messages: tuple[dict[str, str], ...] = ()) -> bytes:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens or self.spec.output_tokens,
                                "stream": True, **self.options}
        if self.spec.api == "chat":
            body["messages"] = list(messages) or [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return orjson.dumps(body)

    def _turn_quota(self) -> int:
        """Requests that may be set up in one loop turn: as many as fit ``SEND_BUDGET_MS`` at the measured
        set-up time, at least one, at most ``SEND_BATCH``."""
        return max(1, min(SEND_BATCH, int(SEND_BUDGET_MS / max(1e-3, self.setup_ms))))

    def _send_gate(self) -> asyncio.Future[None] | None:
        """None when this request may be set up and sent in this loop turn, else a future that a later turn
        resolves (FIFO, :meth:`_turn_quota` per turn).

        A closed loop's wave (hundreds of requests ending in one read, each worker sending its next at once)
        or a phase's start (every worker, each with a new connection) set up hundreds of requests in one
        turn: 10-30 ms during which no socket is polled, so every chunk arriving meanwhile is stamped late.
        A few per turn leave the polls in between; a deferred request waits a turn or two (under a
        millisecond), which its schedule lag shows. How many fit a turn follows the measured set-up time:
        16 set-ups opening new connections at a phase's start took 6-14 ms in one turn (c=256, timed per
        callback on the standard event loop)."""
        if self._turn_sends < self._turn_quota() and not self._gate_waiters:
            self._turn_sends += 1
            self._arm_turn()
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gate_waiters.append(fut)
        self._arm_turn()
        return fut

    def _setup_done(self, passed_ns: int, sent_ns: int) -> None:
        """A request's set-up time (gate passed -> request written; a new connection's connect included, at
        most 5 ms counted) into the moving average the gate sizes its turns by."""
        if sent_ns >= passed_ns:
            self.setup_ms += 0.1 * (min(5.0, (sent_ns - passed_ns) / 1e6) - self.setup_ms)

    def _arm_turn(self) -> None:
        if not self._turn_armed:
            self._turn_armed = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_armed = False
        self._turn_sends = 0
        waiters = self._gate_waiters
        quota = self._turn_quota()
        while waiters and self._turn_sends < quota:
            fut = waiters.popleft()
            if not fut.done():  # a cancelled request no longer waits
                self._turn_sends += 1
                fut.set_result(None)
        if waiters or self._turn_sends:
            self._arm_turn()

    async def _one(self, phase: int, warmup: bool, intended_ns: int | None, capped: bool = False,
                   item: ReplayItem | None = None, turn: Turn | None = None) -> StreamResult:
        gate = self._send_gate()
        if gate is not None:
            await gate
        passed_ns = now_ns()
        seq = self.seq
        self.seq += 1
        rid = f"{self.token}-{seq}"
        max_tokens = self.spec.output_tokens
        if item is not None and self.spec.replay is not None:
            req = item[2]
            prompt = self.prompts.make_replay(seq, req.input_tokens, req.prefix, self.spec.replay.block_tokens)
            max_tokens = req.output_tokens
        elif turn is not None:  # a task's turn: the conversation so far (probes/sessions.py)
            prompt = turn.prompt
        else:
            prompt = self.prompts.make(seq)
        # ids come from the OS, not the seeded workload RNG: two captures with the same --seed must not
        # send the same trace ids into a user's collector (--otlp-export)
        trace_id = secrets.token_hex(16)
        span_id = secrets.token_hex(8)
        headers = {"x-request-id": rid, "traceparent": f"00-{trace_id}-{span_id}-01"}
        res = StreamResult()
        try:
            await self.client.stream(self.path, self._body(prompt.text, max_tokens,
                                                           turn.messages if turn is not None else ()), res, headers)
        except asyncio.CancelledError:
            res.error = "incomplete"
            res.error_detail = self.cut_reason or "capture stopped while the request was in flight"
            res.end_ns = now_ns()
            if not res.sent_ns:
                res.sent_ns = res.end_ns
            raise
        finally:
            if res.headers_ns is not None or res.t_ns:  # it was sent (a failed connect measured nothing)
                self._setup_done(passed_ns, res.sent_ns)
            self._record(rid, phase, warmup, intended_ns, capped, prompt.text, prompt.tokens, prompt.source,
                         trace_id, span_id, res, max_tokens, item, turn)
        return res

    def _clean_detail(self, detail: str, prompt: str, min_words: int = 3) -> str:
        """A server's error text as it may be stored: secrets redacted, the request's own prompt removed
        (unless --store-text), one bounded line (issue 12, defect 1)."""
        d = self.redactor.text(detail)
        if not self.spec.store_text:
            d = scrub_text(d, (prompt,), min_words)
        return excerpt(d)

    def _record(self, rid: str, phase: int, warmup: bool, intended_ns: int | None, capped: bool, text: str,
                ptok: int, psource: str, trace_id: str, span_id: str, res: StreamResult, max_tokens: int,
                item: ReplayItem | None = None, turn: Turn | None = None) -> None:
        if res.error_detail:
            res.error_detail = self._clean_detail(res.error_detail, text)
        usage = res.usage or {}
        details = usage.get("prompt_tokens_details")
        rec: dict[str, Any] = {
            "rid": rid, "phase": phase, "warmup": warmup, "api": self.spec.api, "intended_ns": intended_ns,
            "capped": capped, "sent_ns": res.sent_ns, "headers_ns": res.headers_ns,
            "first_token_ns": res.t_ns[0] if res.t_ns else None, "end_ns": res.end_ns or now_ns(),
            "ok": res.error is None, "http_status": res.status, "error": res.error,
            "error_detail": res.error_detail, "prompt_tokens": ptok, "prompt_tokens_source": psource,
            "prompt_tokens_usage": usage.get("prompt_tokens"), "max_tokens": max_tokens,
            "output_tokens_usage": usage.get("completion_tokens"), "output_tokens_chunks": sum(res.tok),
            "n_chunks": len(res.t_ns), "finish_reason": res.finish_reason, "trace_id": trace_id,
            "span_id": span_id,
            "cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None,
        }
        if item is not None:  # what `diagnose workload` needs to write the request back (no text)
            index, loop, req = item
            rec["replay_index"] = index
            rec["replay_loop"] = loop
            rec.update(req.structure())
            if req.session is not None:
                # a session replayed per loop: one task a loop, its turns those of the file
                rec["session"] = f"{req.session}" if loop == 0 else f"{req.session}#{loop}"
                rec["turn"] = self.turn_of[index]
                rec["turns"] = self.session_turns[req.session]
        if turn is not None:  # its task, turn, planned turns and attempt (probes/sessions.py)
            rec.update(turn.structure())
        if self.spec.store_text:
            rec["prompt_text"] = text
            rec["output_text"] = "".join(res.text or [])
        self._req_buf.append(rec)
        if res.t_ns:
            self._chunk_buf.append({"rid": rid, "t_ns": res.t_ns, "tok": res.tok})
        cat = res.error or "ok"
        self.counts[cat] += 1
        st = self.stats
        st.done += 1
        if res.error is None:
            self.consecutive_connect_failures = 0
            self.same_failures = 0
            if res.t_ns:
                st.ttft_ms.append((res.t_ns[0] - res.sent_ns) / 1e6)
                if len(res.t_ns) > 1:
                    st.itl_ms.append((res.t_ns[-1] - res.t_ns[0]) / 1e6 / (len(res.t_ns) - 1))
        elif cat != "incomplete":
            st.errors += 1
            self._note_failure(res)
            if cat in CONNECT_ERRORS:
                self.consecutive_connect_failures += 1
                if self.consecutive_connect_failures >= ABORT_AFTER_CONNECT_FAILURES and not self.abort_reason:
                    self.abort_reason = (f"server stopped accepting connections ({res.error_detail}); "
                                         f"stopped after {ABORT_AFTER_CONNECT_FAILURES} failures in a row")
                    self.stopping = True

    def _note_failure(self, res: StreamResult) -> None:
        """Back-off: a Retry-After pauses new requests; the same answer to ABORT_AFTER_SAME_FAILURES requests
        in a row stops the load, saying what the server answered; the client's own file limit stops it at once."""
        detail = res.error_detail or ""
        if detail.startswith(CLIENT_LIMIT) and not self.abort_reason:
            self.abort_reason = f"{detail}; stopped sending"
            self.stopping = True
            return
        if res.retry_after_s is not None and res.retry_after_s > 0:
            hold = now_ns() + int(min(res.retry_after_s, MAX_RETRY_AFTER_S) * 1e9)
            self.hold_until_ns = max(self.hold_until_ns, hold)
            self.notes["retry_after_holds"] = int(self.notes.get("retry_after_holds", 0)) + 1
            self.notes["retry_after_s_last"] = res.retry_after_s
        kind = f"HTTP {res.status}" if res.status and res.status != 200 else str(res.error)
        self.answers[kind] += 1
        self.last_failure = detail
        if res.error in CONNECT_ERRORS:
            return  # counted by consecutive_connect_failures
        if kind == self.fail_kind:
            self.same_failures += 1
        else:
            self.fail_kind, self.same_failures = kind, 1
        if self.same_failures >= ABORT_AFTER_SAME_FAILURES and not self.abort_reason:
            what = f"answered {kind}" if kind.startswith("HTTP") else f"failed with {kind}"
            self.abort_reason = (f"the server {what} to {self.same_failures} requests in a row, none succeeding"
                                 f" (last: {detail or kind}); stopped sending")
            self.stopping = True

    async def _hold(self) -> bool:
        """Waits out a Retry-After pause (until ``hold_until_ns`` or the capture stops); True if it waited."""
        delay = (self.hold_until_ns - now_ns()) / 1e9
        if delay <= 0 or self.stopping:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.ctx.stop.wait(), delay)
        return True

    # -- set-up ---------------------------------------------------------------------------------
    async def _resolve_model(self) -> str | None:
        model = self.spec.model or self.ctx.target.model
        if model:
            return model
        with contextlib.suppress(RequestFailed, orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            status, body = await self.client.request("GET", "/v1/models")
            if status == 200:
                return str(orjson.loads(body)["data"][0]["id"])
        return None

    async def _negotiate(self) -> StreamResult:
        """One small request per option set until the server accepts one (400 = option rejected)."""
        usage_opts: list[dict[str, Any]] = [{"include_usage": True, "continuous_usage_stats": True},
                                            {"include_usage": True}, {}]
        eos = [True, False] if self.spec.ignore_eos else [False]
        res = StreamResult()
        for ign in eos:
            for so in usage_opts:
                self.options = ({"stream_options": so} if so else {}) | ({"ignore_eos": True} if ign else {})
                self.client.continuous_usage = bool(so.get("continuous_usage_stats"))
                res = StreamResult()
                await self.client.stream(self.path, self._body(" hello world", 2), res,
                                         {"x-request-id": f"{self.token}-preflight"})
                # the server counts it: the status keeps it, so the bundle accounts for every request sent
                self.notes.setdefault("preflight_requests", []).append({
                    "rid": f"{self.token}-preflight", "http_status": res.status, "ok": res.error is None,
                    "error": res.error, "output_tokens": sum(res.tok), "request_options": dict(self.options)})
                if res.status != 400:
                    if res.error_detail:
                        res.error_detail = self._clean_detail(res.error_detail, " hello world", 2)
                    return res
        return res

    # -- phases ---------------------------------------------------------------------------------
    def _over(self, deadline: int | None) -> bool:
        """The capture is stopping or the phase's deadline has passed."""
        return self.stopping or (deadline is not None and now_ns() >= deadline)

    def _num_requests(self, ph: Phase) -> int | None:
        return ph.num_requests if ph.num_requests is not None else self.spec.num_requests

    async def _closed(self, ph: Phase, deadline: int | None) -> None:
        if self.spec.turns > 1 and ph.role != "baseline":
            await self._tasks(ph, deadline)
            return
        quota = _Quota(self.spec.warmup_requests, self._num_requests(ph))

        async def worker() -> None:
            prev: int | None = None  # a worker's first send follows no completion: no schedule lag for it
            while not self._over(deadline):
                warm = quota.take()
                if warm is None:
                    return
                if await self._hold():
                    prev = None  # a pause the server asked for is no schedule lag of the client
                    if self._over(deadline):
                        return
                res = await self._one(ph.index, warm, prev)
                prev = res.end_ns or now_ns()

        await _run_workers(worker, max(1, ph.concurrency or 1))

    async def _tasks(self, ph: Phase, deadline: int | None) -> None:
        """A closed loop of tasks (``--turns``; probes/sessions.py): each worker runs one task at a time, its
        next task when the last answer of the previous one arrives. ``--warmup`` and ``--num-requests`` count
        tasks here."""
        plan = TaskPlan(self.spec.turns, self.spec.think_time_s, self.spec.retries)
        quota = _Quota(self.spec.warmup_requests, self._num_requests(ph))
        n_task = 0

        def over() -> bool:
            return self._over(deadline)

        def new_prompt() -> Prompt:
            self.seq += 1  # the new user text's number (kept apart from the request numbers _one takes)
            return self.prompts.make(1_000_000 + self.seq)

        async def send(warm: bool, due: int | None, turn: Turn) -> StreamResult:
            if await self._hold():
                due = None  # a pause the server asked for is no schedule lag of the client
            return await self._one(ph.index, warm, due, turn=turn)

        async def worker() -> None:
            nonlocal n_task
            due: int | None = None
            while not over():
                warm = quota.take()
                if warm is None:
                    return
                n_task += 1
                conv = Conversation(self.prompts, f"{self.token}-t{ph.index}-{n_task}", plan.turns, self.spec.seed)
                due = await run_task(plan, conv, warm, due, send, new_prompt, over, now_ns)
                if due is None:
                    return

        await _run_workers(worker, max(1, ph.concurrency or 1))

    async def _open(self, ph: Phase, start: int, deadline: int | None) -> None:
        rate = float(ph.rate or 1.0)
        gap = _gap_fn(self.spec, rate, random.Random(f"{self.spec.seed}-{ph.index}"))
        sem = asyncio.Semaphore(ph.max_concurrency) if ph.max_concurrency else None
        tasks: set[asyncio.Task[Any]] = set()
        n = self._num_requests(ph)
        total = None if n is None else n + self.spec.warmup_requests

        async def capped_one(warm: bool, intended: int) -> None:
            assert sem is not None
            capped = sem.locked()
            async with sem:
                await self._one(ph.index, warm, intended, capped)

        t_next = float(start)
        i = 0
        try:
            while not self.stopping and (total is None or i < total):
                t_next += gap() * 1e9
                if deadline is not None and t_next >= deadline:
                    break
                if self.hold_until_ns > t_next:  # Retry-After: the arrivals it covers are not sent
                    await self._hold()
                    t_next = max(t_next, float(now_ns()))
                    if self.stopping:
                        break
                    continue
                if await sleep_until(int(t_next), lambda: self.stopping):
                    break
                warm = i < self.spec.warmup_requests
                coro = capped_one(warm, int(t_next)) if sem else self._one(ph.index, warm, int(t_next))
                _spawn(tasks, coro)
                i += 1
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            await _cancel_all(tasks)

    async def _replay(self, ph: Phase, rp: Replay, start: int, deadline: int | None) -> None:
        """Sends each request of the workload file at its recorded offset (divided by ``speed``), ``loop``
        times over (a loop starts one period after the previous one, ``Replay.period_s``), optionally capped
        at ``max_concurrency`` in flight (a request that waits for the cap is marked ``capped``). A
        Retry-After pause delays the requests it covers (their schedule lag shows it); none is dropped. With
        ``session_wait`` a session's turn is not sent before the previous turn of its session has ended."""
        sem = asyncio.Semaphore(ph.max_concurrency) if ph.max_concurrency else None
        tasks: set[asyncio.Task[Any]] = set()
        cap = self._num_requests(ph)
        period = rp.period_s()
        # a conversation: a session's turn is sent at its offset, but never before the previous turn's answer
        # has ended (--no-session-wait: at its offset regardless). Each turn resolves a future with the time
        # its answer ended, which its next turn awaits; a turn that waited is due then (its schedule lag
        # starts there).
        answered: dict[tuple[int, str], asyncio.Future[int]] = {}

        async def one(warm: bool, intended: int, item: ReplayItem) -> None:
            if sem is None:
                await self._one(ph.index, warm, intended, False, item)
                return
            capped = sem.locked()
            async with sem:
                if deadline is not None and now_ns() >= deadline:  # --duration is wall time: not sent
                    return
                await self._one(ph.index, warm, intended, capped, item)

        async def turn(warm: bool, intended: int, item: ReplayItem, prev: asyncio.Future[int] | None,
                       mine: asyncio.Future[int]) -> None:
            try:
                if prev is not None and (ended := await asyncio.shield(prev)) > intended:
                    intended = ended
                    if deadline is not None and intended >= deadline:  # --duration is wall time: not sent
                        return
                    if await sleep_until(intended, lambda: self.stopping):
                        return
                await one(warm, intended, item)
            finally:
                if not mine.done():
                    mine.set_result(now_ns())

        def plan() -> Iterator[tuple[ReplayItem, int]]:  # (the request, when it is due: ns, monotonic)
            for lp in range(rp.loop):
                for idx, req in enumerate(rp.requests):
                    yield (idx, lp, req), start + int((lp * period + req.offset_s) / rp.speed * 1e9)

        i = 0
        seq0 = self.seq
        try:
            for item, t in plan():
                if self.stopping or (cap is not None and i >= cap) or (deadline is not None and t >= deadline):
                    break
                if self.hold_until_ns > t:
                    await self._hold()
                    if self.stopping:
                        break
                if await sleep_until(t, lambda: self.stopping):
                    break
                warm = i < self.spec.warmup_requests
                session = item[2].session
                if session is not None and self.spec.session_wait:
                    key = (item[1], session)
                    prev = answered.get(key)
                    answered[key] = mine = asyncio.get_running_loop().create_future()
                    _spawn(tasks, turn(warm, t, item, prev, mine))
                else:
                    _spawn(tasks, one(warm, t, item))
                i += 1
            if tasks and deadline is not None:  # --duration is wall time: what is in flight at its end gets the
                # grace an outside stop gives, then is cancelled (recorded incomplete, with this reason)
                done, late = await asyncio.wait(set(tasks), timeout=max(0, deadline - now_ns()) / 1e9 + STOP_GRACE_S)
                await asyncio.gather(*done)  # an error of a finished one surfaces as before
                if late:
                    self.cut_reason = (f"the replay's --duration ended while the request was in flight (cut "
                                       f"{STOP_GRACE_S:g} s later)")
            elif tasks:
                await asyncio.gather(*tasks)
        finally:
            await _cancel_all(tasks)
            self.cut_reason = ""
            # due before the end but never sent: held by --max-concurrency or a session's wait past --duration
            self.notes["replay_unsent"] = self.notes.get("replay_unsent", 0) + i - (self.seq - seq0)

    async def _phase(self, ph: Phase, rec: dict[str, Any]) -> None:
        start = now_ns()
        rec["start_ns"] = start
        dur = ph.duration_s if ph.duration_s is not None else self.spec.duration_s
        if ph.duration_s is None and self._num_requests(ph) is not None:
            dur = None  # a request count bounds the phase
        deadline = start + int(dur * 1e9) if dur else None
        self.stats.phase_label = ph.name
        self.stats.phase_end_s = None if deadline is None else deadline / 1e9
        if self.spec.replay is not None and ph.role != "baseline":
            await self._replay(ph, self.spec.replay, start, deadline)
        elif ph.rate is not None:
            await self._open(ph, start, deadline)
        else:
            await self._closed(ph, deadline)

    async def _run_phase(self, ph: Phase) -> bool:
        """Runs one phase; returns False when the capture was stopped from outside during it."""
        seq0 = self.seq
        mode = ("replay" if self.spec.replay is not None and ph.role != "baseline"
                else "rate" if ph.rate else "concurrency")
        rec: dict[str, Any] = {"phase": ph.index, "name": ph.name, "mode": mode,
                               "concurrency": ph.concurrency, "rate": ph.rate, "max_concurrency": ph.max_concurrency,
                               "role": ph.role, "repeat": ph.repeat, "arrival": self.spec.arrival, "burstiness": self.spec.burstiness,
                               "start_ns": now_ns(), "end_ns": None, "warmup_requests": self.spec.warmup_requests}
        task = asyncio.ensure_future(self._phase(ph, rec))
        stop_wait = asyncio.ensure_future(self.ctx.stop.wait())
        outside = False
        try:
            await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                outside = True
                self.stopping = True
                await asyncio.wait({task}, timeout=STOP_GRACE_S)
                if not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            elif task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        finally:
            stop_wait.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            rec["end_ns"] = now_ns()
            rec["requests"] = self.seq - seq0
            rec["interrupted"] = outside or not task.done() or task.cancelled()
            self.ctx.shared.setdefault("phases", []).append(rec)
            await self._phase_end(rec)
        return not outside

    async def _phase_end(self, rec: dict[str, Any]) -> None:
        """End-of-phase bookkeeping, with no request of the phase in flight: the phase's records are
        serialised a slice per loop turn (the I/O thread writes them; nothing here waits for the disk), then
        the collector's oldest generation runs over what the phase left (set-up objects stay frozen, so it
        scans only those) and the survivors are frozen too."""
        await self.drain()
        self._write(self.w_phases, [rec])
        if self._gc_deferred:
            t0 = time.perf_counter_ns()
            gc.collect()
            gc.freeze()
            self.monitor.note("phase_end", (time.perf_counter_ns() - t0) / 1e6)

    # -- main -----------------------------------------------------------------------------------
    async def run(self) -> ProbeStatus:
        interrupted = False
        gc_thresholds: tuple[int, int, int] | None = None
        try:
            self.model = await self._resolve_model()
            self.notes["prompt_calibration"] = await self.prompts.calibrate(self.client, self.model)
            self.notes["prompt_tokens_planned"] = self.prompts.planned_tokens()
            self.notes["shared_prefix_tokens"] = self.prompts.shared_prefix_tokens()
            pre = await self._negotiate()
            if pre.error in CONNECT_ERRORS:
                self.counts[pre.error or "?"] += 1
                self.abort_reason = f"cannot reach {self.ctx.target.safe_url}: {pre.error_detail}"
                return self._status(False)
            self.notes["preflight"] = "ok" if pre.ok else f"{pre.error}: {pre.error_detail}"
            gc.collect()
            gc.freeze()  # set-up objects never need scanning again: shorter GC pauses while streaming
            # Full (oldest-generation) collections scan every live object and stall the loop for several
            # ms at high concurrency, which shows up as late first-chunk stamps (TTFT error P99 12.5 ms vs
            # 6 ms with the collector off, benchmarks/results/client_bench_summary.md). Young generations
            # still collect short-lived cycles; the old generation is collected at phase boundaries
            # (_phase_end) and when the run ends.
            gc_thresholds = gc.get_threshold()
            gc.set_threshold(gc_thresholds[0], gc_thresholds[1], 1_000_000)
            self._gc_deferred = True
            self.monitor.start()
            for ph in self.spec.phases:
                if self.stopping:
                    break
                if not await self._run_phase(ph):
                    interrupted = True
                    break
            await self.monitor.stop()
            self.notes["client_stalls"] = self.monitor.summary()
            return self._status(interrupted)
        finally:
            await self.monitor.stop()
            try:
                await self.drain(wait_io=True)
                self.flush()  # nothing left to write by now; raises a write error the drain did not see
            finally:
                self._io.shutdown(wait=True)
            self._gc_deferred = False
            gc.unfreeze()
            if gc_thresholds is not None:
                gc.set_threshold(*gc_thresholds)
            await self.client.close()
            self.ctx.stop.set()


def _enabled(o: Options) -> bool:
    """Load is sent unless ``--observe``, which refuses a load level given with it."""
    if o["observe"] and (o["concurrency"] or o["rate"] or o.get("workload")):
        raise InputError("--observe sends no requests: drop --concurrency/--rate/--workload")
    return not o["observe"]


def _build(o: Options, setup: ProbeSetup) -> LoadProbe:
    return LoadProbe(setup.workload if setup.workload is not None else workload_from_options(o),
                     progress=o["progress"])


SPEC = ProbeSpec(
    name="load", title="Load (the requests sent; none with --observe)",
    enabled=_enabled, build=_build,
    options=(
        ProbeOption("--api", choices=("completions", "chat"), default="completions", show_default=True),
        ProbeOption("--concurrency", short="-c",
                    help="Closed loop: requests kept in flight; a list or ladder sweeps (1,4,16 or 1:64:x2)."),
        ProbeOption("--rate", short="-r", help="Open loop: requests per second; a list or ladder sweeps (2,4,8)."),
        ProbeOption("--arrival", choices=("poisson", "gamma", "constant"), default="poisson", show_default=True),
        ProbeOption("--burstiness", type=float, default=1.0, show_default=True,
                    help="Gamma shape (1 = Poisson, <1 burstier)."),
        ProbeOption("--max-concurrency", type=int, help="Open loop or replay: cap on requests in flight."),
        ProbeOption("--workload", type=Path, metavar="FILE",
                    help="Replay this workload file (diagnose JSONL, Mooncake JSONL or Azure trace CSV; "
                         "docs/workload.md): each request at its recorded offset with its recorded lengths."),
        ProbeOption("--speed", type=float, default=1.0, show_default=True,
                    help="With --workload: time scale (2 = twice as fast)."),
        ProbeOption("--loop", type=int, default=1, show_default=True,
                    help="With --workload: replay the file this many times."),
        ProbeOption("--session-wait/--no-session-wait", flag=True, default=True, show_default=True,
                    help="With --workload: a session's turn waits for the previous turn's answer (a "
                         "conversation), then its recorded offset; --no-session-wait sends every request at "
                         "its offset."),
        ProbeOption("--num-requests", short="-n", type=int, help="Per load level, instead of a duration."),
        ProbeOption("--repeat", type=int, default=1, show_default=True,
                    help="Run each load level this many times, interleaved (c=1 r1, c=8 r1, c=1 r2, ...): "
                         "compare resamples the repeats and reports their spread."),
        ProbeOption("--warmup", type=int, default=2, show_default=True,
                    help="Warm-up requests per level, excluded from statistics."),
        ProbeOption("--baseline", type=int, default=8, show_default=True,
                    help="Sequential requests at concurrency 1 first, as the run's own reference (0: none)."),
        ProbeOption("--turns", type=int, default=1, show_default=True,
                    help="Requests a task: each closed-loop worker runs tasks of N turns, a turn sent when the "
                         "previous answer arrived (plus --think-time), its prompt the conversation so far "
                         "(multi-turn chat, agent chains; docs/workload.md). Task latency is reported beside "
                         "the requests'."),
        ProbeOption("--think-time", metavar="DURATION",
                    help="With --turns: pause between an answer and the next turn (a user reading, a tool call)."),
        ProbeOption("--retries", type=int, default=0, show_default=True,
                    help="With --turns: send a failed turn again up to N times before the task is abandoned."),
        ProbeOption("--input-tokens", type=int, default=128, show_default=True),
        ProbeOption("--output-tokens", type=int, default=64, show_default=True),
        ProbeOption("--ignore-eos/--no-ignore-eos", flag=True, default=True, show_default=True,
                    help="Ask the engine to generate exactly --output-tokens (where it supports it)."),
        ProbeOption("--shared-prefix", type=float, default=0.0, show_default=True,
                    help="Fraction of each prompt shared by all requests (prompts are otherwise unique)."),
        ProbeOption("--seed", type=int, default=0, show_default=True),
        ProbeOption("--timeout", default="60s", show_default=True, help="Per-request timeout."),
        ProbeOption("--progress/--no-progress", flag=True, help="Live progress line (default: only on a terminal)."),
    ),
)
